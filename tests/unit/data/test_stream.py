"""Streams split over ranks and loader workers, and a resumed epoch's skip (no processes)."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.data import IterableDataset

import ddpkit
from ddpkit.data import stream
from ddpkit.data.stream import RankShard, StreamLoader


class Shards(IterableDataset[int]):
    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __iter__(self) -> Iterator[int]:
        return (item for shard in self.shards() for item in shard)

    def shards(self) -> list[range]:
        starts = [sum(self.sizes[:k]) for k in range(len(self.sizes))]
        return [range(start, start + size) for start, size in zip(starts, self.sizes, strict=True)]


def read_as(dataset: Any, rank: int, worker: int, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """What loader worker ``worker`` of 3 on ``rank`` of 2 reads."""
    info = SimpleNamespace(num_workers=3, id=worker)
    monkeypatch.setattr(stream, "get_worker_info", lambda: info)
    return list(RankShard(dataset, rank=rank, world_size=2))


@pytest.mark.parametrize("dataset", [range(50), Shards([9, 1, 7, 7, 3, 0, 12, 4, 5, 2])])
def test_ranks_and_workers_read_every_item_exactly_once(
    dataset: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = [read_as(dataset, r, w, monkeypatch) for r in (0, 1) for w in (0, 1, 2)]
    assert sorted(item for part in parts for item in part) == list(range(50))


def test_whole_shards_go_to_one_process_each(monkeypatch: pytest.MonkeyPatch) -> None:
    assert read_as(Shards([3, 2, 4]), rank=1, worker=0, monkeypatch=monkeypatch) == [3, 4]


def test_a_stream_loader_has_no_length_and_skips_a_resumed_epochs_steps() -> None:
    ddpkit.init()
    try:
        loader = ddpkit.prepare_loader(Shards([5, 3]), batch_size=2)
        assert isinstance(loader, StreamLoader) and not isinstance(loader, Sized)
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        loader.start_at_batch(3)
        assert [b.tolist() for b in loader] == [[6, 7]]
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]  # once only
    finally:
        ddpkit.shutdown()


def test_a_stream_under_verify_is_refused_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPKIT_VERIFY_AS_WORLD", "2")
    ddpkit.init()
    try:
        with pytest.raises(ddpkit.ConfigError, match="verify does not compare runs over an"):
            ddpkit.prepare_loader(Shards([4]), batch_size=2)
    finally:
        ddpkit.shutdown()


def test_the_epoch_reaches_the_dataset() -> None:
    seen = []

    class Epochs(Shards):
        def set_epoch(self, epoch: int) -> None:
            seen.append(epoch)

    ddpkit.init()
    try:
        loader = ddpkit.prepare_loader(Epochs([2]), batch_size=1)
        from ddpkit.data.epochs import set_epoch

        set_epoch(loader, 4)
        assert seen == [4] and torch.is_tensor(next(iter(loader)))
    finally:
        ddpkit.shutdown()


def test_accumulation_ends_with_the_streams_last_batch() -> None:
    """A stream has no length; its loader says one step ahead which batch is the last, so
    the last accumulation group is stepped, not carried into the next epoch."""
    import torch.nn.functional as F

    ddpkit.init(seed=0)
    try:
        model = ddpkit.prepare_model(torch.nn.Linear(1, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step = lambda batch: F.mse_loss(model(batch), batch)  # noqa: E731
        trainer = ddpkit.Trainer(model, opt, accumulate=2, training_step=step)
        as_column = lambda items: torch.tensor([items], dtype=torch.float32).T  # noqa: E731
        loader = ddpkit.prepare_loader(Shards([5]), batch_size=1, collate_fn=as_column)
        trainer.fit(loader, epochs=2)
        assert trainer.step == 6  # 5 batches: groups of 2, 2 and 1, each epoch
    finally:
        ddpkit.shutdown()
