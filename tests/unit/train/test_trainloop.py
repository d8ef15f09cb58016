"""A hand-written loop through TrainLoop: exact resume, loss checks, labels, clear misuse errors."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ddpkit
from ddpkit.checkpoint import list_checkpoints
from ddpkit.errors import ConfigError, NonFiniteLossError
from ddpkit.faulttolerance.groups import ReplicaGroups
from helpers.mp_workers import cpu_state, toy_dataset


class Crash(Exception):
    pass


def dropout_model() -> nn.Module:
    torch.manual_seed(0)  # dropout: the result depends on the random state as well
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))


def train(
    folder: Path | None, crash_at: int | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Three epochs of a plain loop with a scheduler and a counter; may crash at a step."""
    ddpkit.init(hang_timeout=0, seed=5)
    model = ddpkit.prepare_model(dropout_model())
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    state = {"model": model, "optimizer": opt, "scheduler": sched, "seen": 0}
    loop = ddpkit.TrainLoop(state, folder, save_every_steps=4 if folder else None)
    loader = ddpkit.prepare_loader(toy_dataset(), batch_size=8)
    for _epoch in loop.epochs(3):
        for x, y in loop.batches(loader):
            if loop.step == crash_at:
                raise Crash
            loop.backward(F.cross_entropy(model(x), y))
            loop.optimizer_step(opt)
            sched.step()
            state["seen"] += len(y)
    result = cpu_state(model)
    ddpkit.shutdown()
    return result, state


def test_a_crashed_loop_resumes_mid_epoch_to_the_same_parameters(tmp_path: Path) -> None:
    expected, straight = train(None)
    with pytest.raises(Crash):
        train(tmp_path, crash_at=7)  # epoch 2 (5 steps per epoch), after the step-4 checkpoint
    ddpkit.shutdown()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["epoch_000001_step_000004.pt"]
    resumed, state = train(tmp_path)
    assert all(torch.equal(resumed[k], expected[k]) for k in expected)
    assert state["seen"] == straight["seen"] == 120  # the plain value came back, then went on
    assert state["scheduler"].last_epoch == 15


def test_a_nan_loss_stops_before_the_update() -> None:
    ddpkit.init(hang_timeout=0)
    model = ddpkit.prepare_model(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loop = ddpkit.TrainLoop({"model": model, "optimizer": opt})
    before = cpu_state(model)
    with pytest.raises(NonFiniteLossError, match=r"loss is nan on rank 0 at step 1 \(epoch 1\)"):
        for _ in loop.epochs(1):
            for x, y in loop.batches(ddpkit.prepare_loader(toy_dataset(), batch_size=8)):
                loop.backward(F.cross_entropy(model(x), y) * float("nan"))
                loop.optimizer_step()
    assert all(torch.equal(before[k], v) for k, v in cpu_state(model).items())


def test_misuse_is_named() -> None:
    ddpkit.init(hang_timeout=0)
    model = ddpkit.prepare_model(nn.Linear(6, 3))
    with pytest.raises(ConfigError, match="state needs the model\\(s\\) and optimizer\\(s\\)"):
        ddpkit.TrainLoop({"model": model})
    loop = ddpkit.TrainLoop(
        {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=1)}
    )
    with pytest.raises(ConfigError, match=r"inside 'for epoch in loop\.epochs"):
        next(iter(loop.batches([1])))


def test_the_ddpkit_loggers_level_silences_the_loops_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Epoch lines, step lines and the start-up line are records of the ``ddpkit`` logger:
    the documented ``setLevel(WARNING)`` silences them, through the Trainer and a
    hand-written loop alike (they were printed past the logger)."""
    ddpkit.init(hang_timeout=0)
    model = ddpkit.prepare_model(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = ddpkit.prepare_loader(toy_dataset(), batch_size=8)
    ddpkit_logger = logging.getLogger("ddpkit")
    level = ddpkit_logger.level
    capsys.readouterr()  # the world's line
    try:
        for silenced in (False, True):
            ddpkit_logger.setLevel(logging.WARNING if silenced else logging.INFO)
            ddpkit.Trainer(model, opt, F.cross_entropy, log_every=2).fit(loader, epochs=1)
            loop = ddpkit.TrainLoop({"model": model, "optimizer": opt}, log_every=2)
            for _ in loop.epochs(1):
                for x, y in loop.batches(loader):
                    loop.backward(F.cross_entropy(model(x), y))
                    loop.optimizer_step()
            out = capsys.readouterr().out
            shown = [line for line in out.splitlines() if line.startswith(("epoch 1/1", "ddpkit"))]
            assert len(shown) == (0 if silenced else 2 * 4), out  # start-up, 2 step lines, epoch
    finally:
        ddpkit_logger.setLevel(level)


def test_an_epoch_that_trains_no_batch_still_ends_with_its_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ddpkit.init(hang_timeout=0)
    model = ddpkit.prepare_model(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loop = ddpkit.TrainLoop({"model": model, "optimizer": opt})
    loader = ddpkit.prepare_loader(toy_dataset(), batch_size=8)
    for epoch in loop.epochs(2):
        if epoch == 0:
            loop.add_metrics({"val_loss": 0.5})  # evaluated only, say
            continue
        for x, y in loop.batches(loader):
            loop.backward(F.cross_entropy(model(x), y))
            loop.optimizer_step(opt)
    ddpkit.shutdown()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    assert lines[0] == "epoch 1/2  val_loss 0.5000  (no batch trained)"
    assert lines[1].startswith("epoch 2/2  loss ") and " s" in lines[1]
    assert [m["epoch"] for m in loop.history] == [1.0, 2.0]


class DroppingGroups(ReplicaGroups):
    """Replica groups that drop the updates at the steps listed (as torchft's vote does when
    an exchange failed), with the same batch dealt again; no torchft behind them."""

    def __init__(self, drop_at: set[int]) -> None:
        super().__init__(group="0")
        self.drop_at, self.updates = drop_at, 0

    def attach(self, run: Any, model: nn.Module) -> None: ...

    def start(self) -> None: ...

    def loss_weight(self) -> float:
        return 1.0

    def finish(self, model: nn.Module) -> bool:
        self.updates += 1
        return self.updates not in self.drop_at


def test_a_dropped_replica_group_step_moves_nothing_on(tmp_path: Path) -> None:
    """The step count, the step's checkpoints and the schedulers of a hand-written loop (told
    by optimizer_step's answer) stay where they were; the weights are untouched and the
    gradients gone."""
    ddpkit.init(hang_timeout=0, seed=5)
    model = dropout_model()
    groups = DroppingGroups(drop_at={2, 3})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    loop = ddpkit.TrainLoop({"model": model, "optimizer": opt}, tmp_path, save_every_steps=2,
                            replica_groups=groups)  # fmt: skip
    x, y = toy_dataset()[:8]
    steps, unchanged, taken = [], [], []
    for _ in loop.epochs(1):
        for _batch in loop.batches([(x, y)] * 5):
            steps.append(loop.step)  # the steps taken before this batch's
            before = cpu_state(model)
            loop.backward(F.cross_entropy(model(x), y))
            taken.append(loop.optimizer_step())
            if taken[-1]:
                sched.step()
            unchanged.append(all(torch.equal(before[k], v) for k, v in cpu_state(model).items()))
    assert [*steps, loop.step] == [0, 1, 1, 1, 2, 3], steps  # updates 2 and 3 dropped
    assert taken == [True, False, False, True, True]
    assert unchanged == [False, True, True, False, False]
    assert all(p.grad is None for p in model.parameters())
    assert [p.name for p in list_checkpoints(tmp_path)][:1] == ["epoch_000001_step_000002.pt"]


def test_the_trainers_schedulers_skip_a_dropped_step() -> None:
    ddpkit.init(hang_timeout=0, seed=5)
    model = dropout_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    trainer = ddpkit.Trainer(
        model, opt, F.cross_entropy, scheduler=sched, replica_groups=DroppingGroups(drop_at={2, 3})
    )
    x, y = toy_dataset()[:8]
    trainer.fit([(x, y)] * 5, epochs=1)
    assert trainer.loop.step == 3 and sched.last_epoch == 3
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)
