"""An epoch of a loader, opened where it stands, and what the run asks of the loader, read
once.

The loop hands the loader here once an epoch and gets back plain values: the batches (from
the position a resume left, the sampler told the epoch, the loader's generator put back),
each as loaded and on the rank's device with its size (:meth:`OpenedEpoch.loaded`), how
many the epoch has, and :class:`LoaderFacts` (its workers, whether it keeps the ranks in
step, its generator's state). Nothing further down the run (the guard, the console's advice,
the checkpoint) holds the loader itself, so a batch's trip goes down to ``data/`` once and
comes back once.

A resumed epoch goes on after the samples done over every rank when the loader is
``prepare_loader``'s over map-style data (its sampler deals the rest over this world's
ranks, any world size); other loaders start after the batches done (ddpkit's sampler skips
them unread; a stream skips them itself; any other loader reads and drops them).

Example:
    >>> import torch, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> loader = ddpkit.prepare_loader(torch.utils.data.TensorDataset(torch.arange(8.0)),
    ...                                batch_size=2, shuffle=False)
    >>> opened = open_epoch(loader, EpochStart(epoch=0, done=3))
    >>> [b[0].tolist() for b in opened.batches], opened.total, opened.facts.workers
    ([[6.0, 7.0]], 4, 0)
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sized
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ddpkit.data.batches import samples_in, to_device
from ddpkit.data.loader import ResumableDistributedSampler


@dataclass(frozen=True)
class LoaderFacts:
    """What the run asks of a training loader, read from it once an epoch.

    Example:
        >>> LoaderFacts.of([1, 2, 3]).workers is None      # not a DataLoader
        True
    """

    workers: int | None  # None: not a DataLoader (nothing loads ahead of the step)
    persistent_workers: bool
    pin_memory: bool
    prefetch_factor: int | None
    ranks_in_step: bool  # a stream's or ReplicaBatches': it keeps the ranks in step itself
    generator_state: torch.Tensor | None  # the loader's generator before the epoch draws

    @classmethod
    def of(cls, loader: Any) -> LoaderFacts:
        """The facts of ``loader`` as it stands now.

        Example:
            >>> LoaderFacts.of(torch.utils.data.DataLoader(range(4))).workers
            0
        """
        return cls(
            workers=getattr(loader, "num_workers", None),
            persistent_workers=bool(getattr(loader, "persistent_workers", False)),
            pin_memory=bool(getattr(loader, "pin_memory", False)),
            prefetch_factor=getattr(loader, "prefetch_factor", None),
            ranks_in_step=bool(getattr(loader, "ranks_in_step", False)),
            generator_state=generator_state(loader),
        )


@dataclass(frozen=True)
class EpochStart:
    """Where an epoch starts: its number (from 0), the batches done before, the global
    position a resume continues at (None: count batches), the loader generator's state the
    epoch began with (None: as the loader has it).

    Example:
        >>> EpochStart(epoch=2).done
        0
    """

    epoch: int
    done: int = 0
    resumed_at: int | None = None
    generator_state: torch.Tensor | None = None


@dataclass(frozen=True)
class OpenedEpoch:
    """An epoch's batches from where it stands, and the numbers its progress counts with.

    ``done``: batches counted as done (a resume at another world size recounts them);
    ``total``: the epoch's batches (None: a stream's, unknown); ``per_batch``: global
    positions one batch on every rank covers (None: the loader cannot go on at a position);
    ``base``: the (position, batches) this process's batches count from; ``restarted``: a
    resume's position was given to a loader that cannot take it, so the epoch restarts.
    """

    batches: Iterator[Any]
    done: int
    total: int | None
    per_batch: int | None
    base: tuple[int, int]
    restarted: bool
    facts: LoaderFacts

    def loaded(self, device: torch.device) -> Iterator[Loaded]:
        """Each batch as the loader gave it and on ``device``, with its size and whether it
        is the epoch's last (a stream's loader tells that one batch ahead).

        Example::

            for batch in open_epoch(loader, start).loaded(torch.device("cpu")): ...
        """
        iterator, total = self.batches, self.total
        for index, batch in enumerate(iterator, start=self.done + 1):
            last = index == total or bool(getattr(iterator, "last", False))
            yield _loaded((batch, to_device(batch, device), samples_in(batch), last))


class Loaded(NamedTuple):
    """One batch of an opened epoch: as loaded (what the hooks get), on the rank's device
    (what the step gets), its samples (None: it holds no tensor to count them by) and
    whether it is the epoch's last."""

    batch: Any
    on_device: Any
    samples: int | None
    last: bool


# Loaded(...) runs a NamedTuple's __new__, Python code: a call a batch (about 3 us in a GPT-2
# step's cold caches, benchmarks/loop_parts.py); tuple.__new__ makes the same object in C
_loaded = functools.partial(tuple.__new__, Loaded)


def open_epoch(loader: Any, start: EpochStart) -> OpenedEpoch:
    """``loader``'s batches of ``start.epoch`` from where it stands: the sampler told the
    epoch, the loader's generator put back, the batches done left out.

    Example::

        opened = open_epoch(loader, EpochStart(epoch, done=progress.batches))
    """
    set_epoch(loader, start.epoch)
    generator = getattr(loader, "generator", None)
    if isinstance(generator, torch.Generator) and start.generator_state is not None:
        generator.set_state(start.generator_state)
    facts = LoaderFacts.of(loader)
    per_batch, total = positions_per_batch(loader), batches_in(loader)
    restarted = start.resumed_at is not None and per_batch is None
    if start.resumed_at is not None and per_batch is not None:
        done, batches = _continue_at(loader, start.resumed_at)
        return OpenedEpoch(batches, done, total, per_batch, (start.resumed_at, done), False, facts)
    done = 0 if restarted else start.done
    return OpenedEpoch(skip_batches(loader, done), done, total, per_batch, (0, 0), restarted,
                       facts)  # fmt: skip


def set_epoch(loader: Any, epoch: int) -> None:
    """Tell the loader's sampler which epoch starts, so its shuffle differs per epoch.

    Example:
        >>> import torch
        >>> loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(2)))
        >>> set_epoch(loader, 3)     # a plain sampler has nothing to set: no-op
    """
    own = getattr(loader, "set_epoch", None)  # a stream's, ReplicaBatches: it reshuffles
    if callable(own):
        own(epoch)
        return
    set_sampler_epoch = getattr(getattr(loader, "sampler", None), "set_epoch", None)
    if callable(set_sampler_epoch):
        set_sampler_epoch(epoch)


def batches_in(loader: Any) -> int | None:
    """How many batches ``loader`` gives, or None when it cannot say: a DataLoader over an
    IterableDataset without ``__len__`` has a ``__len__`` that raises TypeError.

    Example:
        >>> batches_in([1, 2, 3]), batches_in(iter([1, 2]))
        (3, None)
    """
    if not isinstance(loader, Sized):
        return None
    try:
        return len(loader)
    except TypeError:
        return None


def generator_state(loader: Any) -> torch.Tensor | None:
    """The state of the loader's own random generator now (it seeds the DataLoader's workers
    and draws once an epoch), or None when it has none.

    Example:
        >>> generator_state([1, 2]) is None
        True
    """
    generator = getattr(loader, "generator", None)
    return generator.get_state() if isinstance(generator, torch.Generator) else None


def positions_per_batch(loader: Any) -> int | None:
    """Global positions one batch of ``loader`` on every rank covers (None: not a loader
    whose epoch can continue at a global position).

    Example:
        >>> positions_per_batch([1, 2]) is None
        True
    """
    sampler = getattr(loader, "sampler", None)
    per_batch = getattr(loader, "batch_size", None)
    if isinstance(sampler, ResumableDistributedSampler) and per_batch:
        return int(per_batch * sampler.num_replicas)
    return None


def _continue_at(loader: Any, position: int) -> tuple[int, Iterator[Any]]:
    """Deal the epoch's samples after ``position`` over this world's ranks; the batches done
    are counted so that the epoch still ends at ``len(loader)``."""
    sampler = loader.sampler
    sampler.start_at(position)
    left = sampler.remaining() / loader.batch_size
    done = len(loader) - (int(left) if loader.drop_last else math.ceil(left))
    return done, iter(loader)


def skip_batches(loader: Any, count: int) -> Iterator[Any]:
    """An iterator over ``loader`` that starts after its first ``count`` batches.

    With ddpkit's sampler the skipped samples are never read; otherwise they are loaded and
    dropped, which gives the same order when the loader's order is fixed for the epoch.

    Example:
        >>> list(skip_batches([10, 20, 30], 2))
        [30]
    """
    start_at_batch = getattr(loader, "start_at_batch", None)
    if callable(start_at_batch):  # it skips them itself (a stream, keeping ranks in step)
        start_at_batch(count)
        return iter(loader)
    sampler = getattr(loader, "sampler", None)
    per_batch = getattr(loader, "batch_size", None)
    if isinstance(sampler, ResumableDistributedSampler) and per_batch:
        sampler.start_at(count * per_batch * sampler.num_replicas)
        count = 0  # the sampler leaves them out: nothing to read
    iterator: Iterator[Any] = iter(loader)
    for _ in range(count):
        next(iterator, None)
    return iterator
