"""An epoch's metric sums: the names agreed on the epoch before cost no agreement (a flag in
the gathered row says whether they changed); a changed set of names is agreed on again; the
loop's epoch end is one collective, the sums gathered with the step times."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import ddpkit
import ddpkit.observe.rankreport as rankreport
import ddpkit.train.steps as steps
from ddpkit.train.steps import MetricSums

CPU = torch.device("cpu")


def test_names_agreed_on_last_epoch_are_not_agreed_on_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gathered: list[int] = []
    real = steps.all_gather_rows

    def counting(rows: torch.Tensor) -> Any:
        gathered.append(1)
        return real(rows)

    monkeypatch.setattr(steps, "all_gather_rows", counting)
    first = MetricSums(CPU)
    first.add({"loss": 1.0}, samples=2)
    assert first.reduced_sums() == (["loss"], [2.0, 2.0]) and len(gathered) == 1
    second = MetricSums(CPU, agreed=first.agreed)  # the next epoch
    second.add({"loss": 3.0}, samples=2)
    assert second.reduced_sums() == (["loss"], [2.0, 6.0]) and len(gathered) == 1
    third = MetricSums(CPU, agreed=second.agreed)  # a name more: agreed on again
    third.add({"loss": 1.0, "accuracy": 0.5}, samples=2)
    assert third.reduced_sums() == (["loss", "accuracy"], [2.0, 2.0, 1.0])
    assert len(gathered) == 2
    fourth = MetricSums(CPU, agreed=third.agreed)  # a name fewer: not reported as 0
    fourth.add({"loss": 1.0}, samples=2)
    assert fourth.reduce() == {"loss": 1.0, "samples": 2.0} and len(gathered) == 3


def test_gathered_rows_are_summed_without_another_collective(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sums = MetricSums(CPU, agreed=["loss"])
    sums.add({"loss": 1.0}, samples=2)
    monkeypatch.setattr(steps, "all_gather_same", lambda row: pytest.fail("gathered again"))
    rows = torch.stack([sums.local_row(), torch.tensor([4.0, 2.0, 0.0]).double()])  # 2 ranks
    assert sums.reduce(rows) == {"loss": 0.6666666666666666, "samples": 6.0}


def test_a_row_is_in_the_agreed_order_and_flags_names_that_differ() -> None:
    reordered = MetricSums(CPU, agreed=["loss", "accuracy"])
    reordered.add({"accuracy": 0.5, "loss": 1.0}, samples=2)  # first seen in another order
    assert reordered.local_row().tolist() == [2.0, 2.0, 1.0, 0.0]
    more = MetricSums(CPU, agreed=["loss"])
    more.add({"loss": 1.0, "accuracy": 0.5}, samples=2)  # a name the others do not know yet
    assert more.local_row().tolist() == [2.0, 2.0, 1.0]
    assert MetricSums(CPU).local_row().tolist() == [0.0, 1.0]  # nothing agreed yet


def test_the_loops_epoch_end_is_one_all_gather(monkeypatch: pytest.MonkeyPatch) -> None:
    ddpkit.init(hang_timeout=0)
    calls: list[str] = []  # ddpkit's collectives, by the names their callers know them by
    for module, name in [(steps, "all_gather_same"), (steps, "all_reduce_sum"),
                         (steps, "all_gather_rows"), (rankreport, "all_gather_same")]:  # fmt: skip
        real = getattr(module, name)

        def counted(*args: Any, _name: str = name, _real: Any = real) -> Any:
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(module, name, counted)
    model = ddpkit.prepare_model(torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(8, 3), torch.randint(0, 2, (8,)))
    loader = ddpkit.prepare_loader(data, batch_size=4)
    loop = ddpkit.TrainLoop({"model": model, "optimizer": opt})
    between_epochs = []  # the collectives from one epoch's body's end to the next's start
    for epoch in loop.epochs(4):
        if epoch:
            between_epochs.append(list(calls))
        for x, y in loop.batches(loader):
            loop.backward(F.cross_entropy(model(x), y))
            loop.optimizer_step(opt)
        calls.clear()
    ddpkit.shutdown()
    assert between_epochs[0][0] == "all_gather_same"  # then the metric names are agreed on
    assert between_epochs[1:] == [["all_gather_same"], ["all_gather_same"]]


@pytest.mark.parametrize("resume_at", [1, 37, 64, 65, 150])
def test_sums_kept_every_step_and_resumed_anywhere_add_up_exactly_as_never_kept(
    resume_at: int,
) -> None:
    """A memory snapshot takes the sums after every step; the batches not yet added go in
    it as plain numbers, not added first: a run resumed from any step, or never stopped,
    ends with the very sums of a run that kept no snapshot (not just to 1e-16)."""
    generator = torch.Generator().manual_seed(resume_at)
    rows = [
        ({"loss": torch.rand((), generator=generator) * 7,
          "accuracy": torch.rand((), generator=generator, dtype=torch.float64)}, 3 + i % 2)
        for i in range(150)
    ]  # fmt: skip
    never_kept, kept = MetricSums(CPU), MetricSums(CPU)
    for index, (values, samples) in enumerate(rows, start=1):
        never_kept.add(values, samples)
        kept.add(values, samples)
        snapshot = kept.local_state()
        if index == resume_at:  # restarted: a new process takes the snapshot up
            kept = MetricSums(CPU)
            kept.load_local_state(snapshot)
    assert torch.equal(kept.sums, never_kept.sums), (kept.sums, never_kept.sums)
