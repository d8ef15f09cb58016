"""An epoch's progress counts each batch by the samples the loop read off it: a batch it cannot
count is a clear error unless the step said its count; a step moves the batches done, and a
checkpoint's place (PartWay) holds them with the epoch's generator."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import ddpkit
from ddpkit.errors import ConfigError
from ddpkit.train.progress import EpochProgress


@pytest.fixture(autouse=True)
def world() -> Iterator[object]:
    yield ddpkit.init(hang_timeout=0)
    ddpkit.shutdown()


def test_a_batch_with_no_countable_samples_asks_for_record() -> None:
    progress = EpochProgress(0)
    progress.note_loss(torch.tensor(0.5))
    with pytest.raises(ConfigError, match=r"loop\.record\(metrics, samples=N\)"):
        progress.end_batch(None, skips_nonfinite=True, done=None)


def test_recorded_samples_count_where_the_batch_cannot() -> None:
    progress = EpochProgress(0)
    progress.record({"loss": torch.tensor(2.0)}, samples=4)
    metrics = progress.end_batch(None, skips_nonfinite=True, done=None)
    assert float(metrics["loss"]) == 2.0 and progress.sums.sums.tolist() == [4.0, 8.0]
    assert progress.batches == 0  # inside an accumulation group: no step, none done


def test_a_step_moves_the_batches_done_and_part_way_holds_them() -> None:
    progress = EpochProgress(0)
    progress.note_loss(torch.tensor(1.0))
    progress.end_batch(3, skips_nonfinite=True, done=2)
    part_way = progress.part_way()
    assert progress.batches == 2 and part_way.state["batches"] == 2
    assert (
        part_way.state["metric_sums"].tolist() == [3.0, 3.0] and part_way.generator_state is None
    )  # samples, loss x samples
