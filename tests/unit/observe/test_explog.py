"""The experiment log's files: a resumed run continues the curve, no duplicate steps."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import ddpkit
from ddpkit.observe import explog
from ddpkit.observe.explog import ExperimentLog


def steps_in(folder: Path, tag: str = "loss") -> list[int]:
    with (folder / "metrics.csv").open(newline="") as rows:
        return [int(row["step"]) for row in csv.DictReader(rows) if row["tag"] == tag]


def test_a_resumed_log_drops_the_points_after_its_checkpoint(tmp_path: Path) -> None:
    ddpkit.init()
    try:
        first = ExperimentLog(tmp_path, resume_step=0, tensorboard=False)
        for step in range(1, 8):  # killed after step 7; its checkpoint was at step 5
            first.log({"loss": 1.0 / step}, step)
        first.flush()
        again = ExperimentLog(tmp_path, resume_step=5, tensorboard=False)
        for step in range(6, 10):
            again.log({"loss": 1.0 / step}, step)
        again.close()
        assert steps_in(tmp_path) == list(range(1, 10))
        fresh = ExperimentLog(tmp_path, resume_step=0, tensorboard=False)  # a new run here
        fresh.close()
        assert steps_in(tmp_path) == []
    finally:
        ddpkit.shutdown()


def test_only_rank_0_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(explog, "is_main", lambda: False)  # as on rank 1
    log = ExperimentLog(tmp_path / "logs", tensorboard=False)
    log.log({"loss": 1.0}, 1)
    log.close()
    assert not (tmp_path / "logs").exists()


def test_a_hand_written_loop_logs_at_its_steps(tmp_path: Path) -> None:
    import torch

    ddpkit.init(seed=0)
    try:
        model = ddpkit.prepare_model(torch.nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.utils.data.TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
        loop = ddpkit.TrainLoop({"model": model, "optimizer": opt}, log_dir=tmp_path)
        for _ in loop.epochs(2):
            loop.log({"epoch_lr": opt.param_groups[0]["lr"]})  # before the epoch's first batch
            for x, y in loop.batches(ddpkit.prepare_loader(data, batch_size=4)):
                loss = torch.nn.functional.mse_loss(model(x), y)
                loop.backward(loss)
                loop.optimizer_step(opt)
                loop.log({"loss": loss})
        assert steps_in(tmp_path) == [1, 2, 3, 4]
        assert steps_in(tmp_path, "epoch_lr") == [0, 2]  # the run's first point too
        assert steps_in(tmp_path, "train/loss") == [1, 2, 3, 4]  # the loop's own points
    finally:
        ddpkit.shutdown()
