"""Streams across ranks: an ``IterableDataset`` read once in all, every rank stepping in step.

A stream has no length and no index, so a sampler cannot shard it. :class:`RankShard` splits
it instead, over ``world size x DataLoader workers`` splits: by the dataset's own shards when
it has them (``dataset.shards()`` returning iterables, files say: each is opened by one
process only, round-robin), else item by item (every process walks the stream and keeps its
items). A Hugging Face ``datasets.IterableDataset`` is split by its own
``split_dataset_by_node`` instead (:func:`rank_share`). Shares can then differ by several
batches, and the classic end-of-epoch hang follows (the ranks with more batches wait in a
gradient all-reduce the others never join).
:class:`StreamLoader` prevents it: before each batch the ranks agree (one small all-reduce)
whether any of them still has data. The epoch ends when none has; until then a rank that ran
out repeats its own first batches, as ``DistributedSampler`` pads a map-style dataset
(``uneven="pad"``), or every rank stops at the shortest share (``uneven="drop"``). Either
way every rank takes the same number of steps, so step checkpoints, stop requests and exact
mid-epoch resume work as they do for map-style data; each epoch says what it padded or dropped.

Example:
    >>> import torch, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> class Numbers(torch.utils.data.IterableDataset):
    ...     def __iter__(self):
    ...         return iter(range(5))
    >>> loader = ddpkit.prepare_loader(Numbers(), batch_size=2)
    >>> [batch.tolist() for batch in loader]
    [[0, 1], [2, 3], [4]]
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ddpkit._core.log import EVERY_RANK, logger
from ddpkit.errors import ConfigError
from ddpkit.runtime.collectives import all_reduce_max

CACHED_BATCHES = 8  # a rank that ran out repeats (cycles through) its first this many


class RankShard(IterableDataset[Any]):
    """This rank's share of ``dataset``, split again over the DataLoader's worker processes.

    Example:
        >>> list(RankShard(range(7), rank=1, world_size=2))
        [1, 3, 5]
    """

    def __init__(self, dataset: Iterable[Any], rank: int, world_size: int) -> None:
        self.dataset, self.rank, self.world_size = dataset, rank, world_size

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        splits, split = workers * self.world_size, worker * self.world_size + self.rank
        shards = getattr(self.dataset, "shards", None)
        if callable(shards):  # whole shards: each is opened by one process only
            for index, shard in enumerate(shards()):
                if index % splits == split:
                    yield from shard
            return
        for index, item in enumerate(self.dataset):
            if index % splits == split:
                yield item

    def set_epoch(self, epoch: int) -> None:
        """Pass the epoch on to a dataset that reshuffles by it."""
        set_dataset_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_dataset_epoch):
            set_dataset_epoch(epoch)


def rank_share(dataset: IterableDataset[Any], rank: int, world_size: int) -> IterableDataset[Any]:
    """This rank's share of a stream: :class:`RankShard`, or the library's own split.

    A Hugging Face ``datasets.IterableDataset`` splits itself over DataLoader workers in its
    ``__iter__``; splitting it again over ``ranks x workers`` would silently drop items, so it
    is split by node with its own ``split_dataset_by_node`` (whole shards when they divide by
    the ranks, else every ``world_size``-th example) and left to split over workers itself.

    Example:
        >>> class Numbers(torch.utils.data.IterableDataset):
        ...     def __iter__(self):
        ...         return iter(range(5))
        >>> list(rank_share(Numbers(), rank=1, world_size=2))
        [1, 3]
    """
    if type(dataset).__module__.split(".")[0] == "datasets":
        from datasets.distributed import split_dataset_by_node  # only where it is installed

        return split_dataset_by_node(dataset, rank=rank, world_size=world_size)  # type: ignore[no-any-return]
    return RankShard(dataset, rank, world_size)


class StreamLoader(DataLoader[Any]):
    """A DataLoader over a rank's share of a stream (:func:`rank_share`) whose ranks end each
    epoch at the same step.

    It has no length (``len()`` is not defined, so the Trainer shows no total); iterating it
    takes one all-reduce per batch. ``start_at_batch(k)`` makes the next iteration skip the
    first ``k`` steps (reading and dropping this rank's batches), for a resumed epoch.

    Example::

        loader = StreamLoader(rank_share(stream, rank, world), "pad", batch_size=32)
    """

    ranks_in_step = True  # every rank ends the epoch at the same step (the loop reads it)

    __len__ = None  # type: ignore[assignment]  # a stream has none: not Sized

    def __init__(self, dataset: IterableDataset[Any], uneven: str, **loader_kwargs: Any) -> None:
        super().__init__(dataset, **loader_kwargs)
        self.uneven = uneven
        self.epoch = 0
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch that starts (passed on to the dataset)."""
        self.epoch = epoch
        set_dataset_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_dataset_epoch):
            set_dataset_epoch(epoch)

    def start_at_batch(self, count: int) -> None:
        """Skip ``count`` steps at the start of the next iteration (a resumed epoch)."""
        self._skip = count

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        skip, self._skip = self._skip, 0
        return _EvenSteps(super().__iter__(), self.uneven, skip, self.epoch)


_END = object()  # the epoch is over, on every rank


class _EvenSteps:
    """This rank's batches, padded or cut so that every rank yields as many.

    Each step is decided one step ahead, so :attr:`last` tells the caller that the batch it
    just received is the epoch's last (an accumulation group or a checkpoint ends there).
    """

    def __init__(self, batches: Iterator[Any], uneven: str, skip: int, epoch: int) -> None:
        self.batches, self.uneven, self.epoch = batches, uneven, epoch
        self.cache: list[Any] = []
        self.real = 0  # batches of this rank's own share yielded or skipped
        self.steps = 0
        self.exhausted = False
        self._ahead: Any = None  # the next step's batch once decided, or _END
        for _ in range(skip):  # the steps a resumed epoch already took: no collective needed
            self._next_own()
            self.steps += 1
        if skip:  # where the uninterrupted run stood: the next step decided before its RNG
            self._ahead = self._decide()  # state was saved (every rank is here too)

    @property
    def last(self) -> bool:
        """Whether the batch last returned is the epoch's last, on every rank."""
        return self._ahead is _END

    def __iter__(self) -> _EvenSteps:
        return self

    def __next__(self) -> Any:
        batch = self._decide() if self._ahead is None else self._ahead
        if batch is _END:
            self._ahead = _END
            raise StopIteration
        self._ahead = self._decide()
        return batch

    def _decide(self) -> Any:
        """The next step's batch, or _END: one collective tells whether any rank has data."""
        own = self._next_own()
        # One collective for both questions: does any rank have a batch? has any run out?
        flags = all_reduce_max(torch.tensor([float(own is not None), float(own is None)]))
        anyone_has_data, someone_out = (flag > 0 for flag in flags.tolist())
        if not anyone_has_data or (self.uneven == "drop" and someone_out):
            self._say_how_it_ended()
            return _END
        batch = own if own is not None else self._repeat()
        self.steps += 1
        return batch

    def _next_own(self) -> Any:
        if self.exhausted:
            return None
        batch = next(self.batches, None)
        if batch is None:
            self.exhausted = True
            return None
        self.real += 1
        if len(self.cache) < CACHED_BATCHES:
            self.cache.append(batch)
        return batch

    def _repeat(self) -> Any:
        if not self.cache:
            raise ConfigError(
                f"this rank received no items of the stream in epoch {self.epoch + 1}, while "
                "other ranks did: give the stream at least as many shards as ranks x loader "
                "workers, or shard it item by item (no shards() method)"
            )
        return self.cache[(self.steps - self.real) % len(self.cache)]  # the first, then on

    def _say_how_it_ended(self) -> None:
        if self.steps > self.real:
            logger.info(
                f"epoch {self.epoch + 1}: this rank's share of the stream ended "
                f"{self.steps - self.real} step(s) before the longest; it repeated its first "
                "batches to keep in step (uneven='pad'; 'drop' stops at the shortest share)",
                extra=EVERY_RANK,
            )
        elif self.uneven == "drop" and not self.exhausted:
            logger.info(
                f"epoch {self.epoch + 1}: stopped with the shortest share after {self.steps} "
                "step(s); this rank's remaining batches were not trained on (uneven='drop')",
                extra=EVERY_RANK,
            )
