"""Ranks with different numbers of batches: find out once per epoch, then join or refuse.

``prepare_loader`` evens the shards out, but a hand-made sampler may not. Under DDP the ranks
that run out first would leave the others waiting in a gradient all-reduce forever, so the
epoch runs under torch's ``Join``, whose finished ranks keep answering. FSDP's all-gathers
cannot be joined, and skipping a step for a non-finite loss needs every rank to agree at each
step: both are refused with the fix.

Example:
    >>> import torch, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> same_batch_count(torch.nn.Linear(1, 1), total=3, nonfinite_loss="error")
    True
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from ddpkit.errors import ConfigError
from ddpkit.parallel.strategy import strategy_of
from ddpkit.runtime.collectives import all_reduce_max
from ddpkit.runtime.session import current_world
from ddpkit.train.guards import NonFiniteLoss


def same_batch_count(model: nn.Module, total: int | None, nonfinite_loss: NonFiniteLoss) -> bool:
    """Whether every rank has ``total`` batches too (one collective); refuses what cannot work.

    ``total`` is None for a loader without a length.
    """
    if current_world().world_size == 1:
        return True
    count = float(total if total is not None else -1)
    # One collective for both ends: the max of -count is minus the min.
    most, negated_fewest = all_reduce_max(torch.tensor([count, -count])).tolist()
    fewest = -negated_fewest
    if most == fewest and fewest >= 0:
        return True
    spread = f"ranks have between {fewest:.0f} and {most:.0f} batches (-1: no length)"
    strategy = strategy_of(model)
    if strategy.uneven_batches == "refuse":
        raise ConfigError(
            f"{strategy.name.upper()} needs the same number of batches on every rank, but "
            f"{spread}; shard with "
            "ddpkit.prepare_loader (uneven='pad' or 'drop'), or use strategy='ddp'"
        )
    if nonfinite_loss == "skip":
        raise ConfigError(
            f"nonfinite_loss='skip' needs every rank to skip the same steps, but {spread}; "
            "shard with ddpkit.prepare_loader, or use nonfinite_loss='error'"
        )
    return False


def join_unless(even: bool, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
    """torch's ``Join`` around an epoch whose ranks hold different numbers of batches.

    Example:
        >>> join_unless(True, torch.nn.Linear(1, 1))  # doctest: +ELLIPSIS
        <contextlib.nullcontext object at ...>
    """
    strategy = strategy_of(model)
    if not even and strategy.uneven_batches == "join":
        return strategy.join(model)
    return contextlib.nullcontext()  # no collectives inside the loop: nothing can hang
