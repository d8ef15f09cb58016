"""The per-batch path stays straight: a step of TrainLoop calls few Python functions of its own.

With the caches a real model's step leaves cold, each Python call on the loop's path costs
the step about a microsecond (benchmarks/loop_parity.py). A count, unlike a time, does not
depend on the machine's load: it fails when a layer, a context manager or a per-step
object construction is added to the path, and names what was called.
"""

from __future__ import annotations

import sys
from collections import Counter
from types import FrameType
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import ddpkit

# Everything that watches the step (clock, hang watchdog, guard, metric sums, console) is on.
# 50 on 2026-11-29, where it was 91: a generator layer, null contexts entered, a NamedTuple
# per phase label, a comprehension per hook with no listener, a helper per tensor moved.
# 52 on 2026-12-06: the guard's _is_due() and the loop's _stop_signal() are called again, not
# written out (a call each; benchmarks/loop_parity.py reads no cost beside its A/A run).
# 43 on 2026-12-07: the clock's backward_done adds its two intervals written out (not two
# _add calls); a run without replica groups asks nothing of Alone (3 calls) and, without
# accumulation either, calls no Updater.begin; a step's batch is counted on the bar with its
# step (RunObserver.batch_done and Console.batch_done only for a batch that ends none); the
# per-batch hooks are called where a callback has them. In a GPT-2 step's cold caches each
# call costs about 3.5 us (benchmarks/loop_parts.py).
# 34 on 2026-12-07: the hang watchdog reads where the loop stands (runtime/position.py) when
# it looks, instead of being told each stage (8 calls: begin, end, three relabels and the
# monitor's helpers around them); the monitor's step_done runs where it checks something.
# 29 the same day: the loop appends a batch's detached loss to the guard's and the epoch's
# lists (no note_loss, no torch attribute read: summed at the check and the batch's end),
# the clock reads a calibrated gradient hook's time without settle(), Loaded is made in C,
# the stop signal is read from an object that is always there.
# 27 on 2026-12-08: the observer calls the profiler's and the console's step_done only where
# a window is ahead or open, a bar is drawn or log_every lines are due.
MOST_CALLS_PER_STEP = 27


class DictSamples(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Samples as a tokenizer gives them (a dict of tensors): batches are dicts."""

    def __init__(self, data: torch.utils.data.TensorDataset) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        inputs, targets = self.data[index]
        return {"inputs": inputs, "targets": targets}


def ddpkit_calls_in_one_step(dict_batches: bool) -> Counter[str]:
    """ddpkit's Python functions, and those it calls itself (the standard library's),
    run in one step of a TrainLoop, from one optimizer step's end to the next's."""
    ddpkit.init(seed=0)  # the hang watchdog on, as by default
    model = ddpkit.prepare_model(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    loader = ddpkit.prepare_loader(DictSamples(data) if dict_batches else data, batch_size=8)
    loop = ddpkit.TrainLoop({"model": model, "optimizer": optimizer})
    calls: Counter[str] = Counter()

    def count(frame: FrameType, event: str, _arg: Any) -> None:
        code, caller = frame.f_code, frame.f_back
        called_by_ddpkit = caller is not None and _is_ddpkit(caller.f_code.co_filename)
        torch_itself = "/torch/" in code.co_filename.replace("\\", "/")  # the step's work
        if (
            event == "call"
            and not torch_itself
            and (_is_ddpkit(code.co_filename) or called_by_ddpkit)
        ):
            calls[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}"] += 1

    for epoch in loop.epochs(2):  # the second epoch: nothing is done for the first time
        for index, batch in enumerate(loop.batches(loader)):
            inputs, targets = batch.values() if dict_batches else batch
            loop.backward(F.cross_entropy(model(inputs), targets))
            loop.optimizer_step(optimizer)
            if epoch == 1 and index == 3:
                sys.setprofile(None)
            if epoch == 1 and index == 2:
                sys.setprofile(count)
    ddpkit.shutdown()
    return calls


def _is_ddpkit(filename: str) -> bool:
    return f"{ddpkit.__name__}/" in filename.replace("\\", "/")


@pytest.mark.parametrize("dict_batches", [False, True], ids=["tuple batches", "dict batches"])
def test_a_step_calls_few_functions_of_ddpkit(dict_batches: bool) -> None:
    calls = ddpkit_calls_in_one_step(dict_batches)
    total = sum(calls.values())
    listed = ", ".join(f"{name} x{n}" for name, n in calls.most_common())
    assert total <= MOST_CALLS_PER_STEP, f"{total} calls in one step: {listed}"
    assert not any("contextlib" in name for name in calls), listed
    assert total > 20, listed  # the count saw the step (its backward, its optimizer step)
