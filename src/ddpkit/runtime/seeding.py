"""One ``seed`` for the whole job: the same model everywhere, different augmentation per rank.

``ddpkit.init(seed=S)`` (or :func:`seed_everything`) seeds Python, NumPy and torch with ``S`` on
every rank, so models built next are identical (DDP and FSDP also broadcast rank 0's weights,
so this holds even for code that seeds per rank). Randomness that should *differ* per rank
(data augmentation, dropout) draws from per-rank streams derived from ``S``: the Trainer
reseeds each rank with :func:`rank_seed` when training starts, and ``prepare_loader`` gives
its DataLoader workers per-rank seeds. Otherwise every rank would crop and flip its shard the
same way, a quiet loss of augmentation diversity.

Example:
    >>> seed_everything(7)
    >>> configured_seed()
    7
    >>> forget_seed()
    >>> rank_seed(7, 0) != rank_seed(7, 1)
    True
"""

from __future__ import annotations

import hashlib
import random

import torch

from ddpkit.errors import ConfigError

try:  # NumPy is optional; seeded when present because augmentation libraries use it
    import numpy as np
except ImportError:  # pragma: no cover - numpy comes with most torch installs
    np = None  # type: ignore[assignment]

_seed: int | None = None


def seed_everything(seed: int) -> None:
    """Seed ``random``, NumPy and torch (all devices) with ``seed`` and remember it.

    Example:
        >>> seed_everything(0); a = torch.rand(1)
        >>> seed_everything(0); bool(torch.rand(1) == a)
        True
        >>> forget_seed()
    """
    global _seed
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise ConfigError(f"seed must be an integer in [0, 2**32) (got {seed!r})")
    _seed = seed
    _seed_all(seed)


def forget_seed() -> None:
    """Forget the configured seed (``ddpkit.shutdown()`` calls this).

    Example:
        >>> forget_seed(); configured_seed() is None
        True
    """
    global _seed
    _seed = None


def configured_seed() -> int | None:
    """The seed given to ``init(seed=...)`` / :func:`seed_everything`, or None.

    Example:
        >>> seed_everything(3); configured_seed()
        3
        >>> forget_seed()
    """
    return _seed


def rank_seed(seed: int, rank: int) -> int:
    """A seed for ``rank``'s own random stream, independent of the other ranks' streams.

    The pair is hashed, so ``(S, 1)`` and ``(S + 1, 0)`` do not collide as ``S + rank`` would.

    Example:
        >>> rank_seed(0, 0) == rank_seed(0, 0), rank_seed(0, 0) == rank_seed(1, 0)
        (True, False)
    """
    digest = hashlib.sha256(f"ddpkit-seed:{seed}:{rank}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def seed_rank_streams(seed: int | None, rank: int) -> None:
    """Reseed this process's RNGs with :func:`rank_seed` (augmentation, dropout); nothing
    without a seed (``ddpkit.init(seed=...)`` not given).

    Example:
        >>> seed_rank_streams(0, 1)
    """
    if seed is not None:
        _seed_all(rank_seed(seed, rank))


def _seed_all(seed: int) -> None:
    random.seed(seed)
    if np is not None:
        np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too
