"""Randomness that belongs to a sample, not to a rank: the same at any world size.

``prepare_loader``'s sampler hands the dataset :class:`SampleIndex` values: plain ints (so
``data[index]`` works as ever) that also carry the epoch and the loader's seed. Inside
``__getitem__``, :func:`sample_generator` turns one into a ``torch.Generator`` seeded by
(seed, epoch, sample): an augmentation drawn from it is the same whichever rank reads the
sample, in how many ranks, in which DataLoader worker, before or after a resume at another
world size, and differs from epoch to epoch. Randomness drawn from a rank's own stream
(``torch.rand`` in ``__getitem__``) is none of these.

Example:
    >>> index = SampleIndex(7, epoch=2, seed=0)
    >>> index + 1, index.epoch
    (8, 2)
    >>> a = torch.rand(2, generator=sample_generator(index))
    >>> b = torch.rand(2, generator=sample_generator(SampleIndex(7, epoch=2, seed=0)))
    >>> torch.equal(a, b)
    True
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ddpkit.errors import ConfigError


class SampleIndex(int):
    """A dataset index that also knows its epoch and the loader's seed.

    Example:
        >>> SampleIndex(3, epoch=1, seed=5) == 3
        True
    """

    __slots__ = ()  # no instance dict: the epoch and seed are the class's (see _of_epoch)
    epoch: int
    seed: int

    def __new__(cls, index: int, epoch: int, seed: int) -> SampleIndex:
        return int.__new__(_of_epoch(epoch, seed), index)

    def __reduce__(self) -> tuple[Any, ...]:  # to DataLoader workers and back, whole
        return (SampleIndex, (int(self), self.epoch, self.seed))


def sample_indices(indices: Iterable[int], epoch: int, seed: int) -> Iterator[SampleIndex]:
    """``indices`` as :class:`SampleIndex` values of ``epoch`` and ``seed``, each made as it
    is read: what a sampler deals out for an epoch.

    One at a time, because each is an object the cyclic collector tracks (every instance of
    a Python-defined int subclass is): an epoch's list of them, alive to its end, set off the
    collector's passes, 70 ms over the first epoch of a 4096-sample set in a fresh process.

    Example:
        >>> [(int(i), i.epoch) for i in sample_indices([4, 2], epoch=1, seed=0)]
        [(4, 1), (2, 1)]
    """
    return map(_of_epoch(epoch, seed), indices)


@functools.lru_cache(maxsize=64)
def _of_epoch(epoch: int, seed: int) -> type[SampleIndex]:
    """The indices of one epoch hold its epoch and seed in their class, not each in its own
    attributes: an index is then a bare int, made in a fifth of the time (a sampler makes
    one per sample, every epoch). It is made by int's constructor, not SampleIndex's."""
    shared = {"__slots__": (), "__new__": int.__new__, "epoch": epoch, "seed": seed}
    return type("SampleIndex", (SampleIndex,), {**shared, "__module__": __name__})


def sample_seed(index: SampleIndex) -> int:
    """The seed of ``index``'s randomness: a hash of (loader seed, epoch, sample).

    Example:
        >>> sample_seed(SampleIndex(1, 0, 0)) == sample_seed(SampleIndex(1, 1, 0))
        False
    """
    if not isinstance(index, SampleIndex):
        raise ConfigError(
            f"sample_generator needs the index prepare_loader's sampler gives __getitem__ "
            f"(it carries the epoch); got a plain {type(index).__name__} {index!r}: build the "
            "loader with ddpkit.prepare_loader, and pass __getitem__'s index on unchanged"
        )
    text = f"ddpkit-sample:{index.seed}:{index.epoch}:{int(index)}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def sample_generator(index: SampleIndex) -> torch.Generator:
    """A CPU generator for ``index``'s own randomness this epoch (see the module's docstring).

    Example::

        def __getitem__(self, index):
            noise = torch.randn(3, generator=ddpkit.sample_generator(index))
            return self.x[index] + 0.1 * noise, self.y[index]
    """
    return torch.Generator().manual_seed(sample_seed(index))
