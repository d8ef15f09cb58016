"""Collective helpers that are no-ops in a world of one.

They use torch.distributed when a process group exists and return their input unchanged when
none does, so the same script runs as 1 process or N without ``if world_size > 1`` branches.

Example:
    >>> all_reduce_mean(3.0)        # no process group: the value itself
    3.0
    >>> is_main()
    True
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, overload

import torch
import torch.distributed as dist

from ddpkit.rendezvous import world_or_none

F = TypeVar("F", bound=Callable[..., Any])


def _group_active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    """Global rank of this process (0 without a process group).

    Example:
        >>> get_rank()
        0
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    world = world_or_none()
    return world.rank if world is not None else 0


def is_main() -> bool:
    """True on global rank 0 (and in a single process).

    Example:
        >>> is_main()
        True
    """
    return get_rank() == 0


def barrier() -> None:
    """Wait until every rank gets here. No-op in a world of one.

    Example:
        >>> barrier()
    """
    if _group_active():
        dist.barrier()


@overload
def all_reduce_sum(value: torch.Tensor) -> torch.Tensor: ...
@overload
def all_reduce_sum(value: float) -> float: ...
def all_reduce_sum(value: torch.Tensor | float) -> torch.Tensor | float:
    """Sum ``value`` over all ranks; every rank gets the result. The input is not modified.

    Example:
        >>> all_reduce_sum(torch.tensor([1.0, 2.0]))
        tensor([1., 2.])
    """
    return _all_reduce(value, dist.ReduceOp.SUM)


@overload
def all_reduce_max(value: torch.Tensor) -> torch.Tensor: ...
@overload
def all_reduce_max(value: float) -> float: ...
def all_reduce_max(value: torch.Tensor | float) -> torch.Tensor | float:
    """Element-wise maximum of ``value`` over all ranks (the minimum: ``-max(-value)``).

    Example:
        >>> all_reduce_max(3.0)
        3.0
    """
    return _all_reduce(value, dist.ReduceOp.MAX)


def _all_reduce(value: torch.Tensor | float, op: Any) -> torch.Tensor | float:
    if not _group_active():
        return value
    tensor = _as_tensor(value)
    dist.all_reduce(tensor, op=op)
    return tensor.to(value.device) if isinstance(value, torch.Tensor) else float(tensor.item())


@overload
def all_reduce_mean(value: torch.Tensor) -> torch.Tensor: ...
@overload
def all_reduce_mean(value: float) -> float: ...
def all_reduce_mean(value: torch.Tensor | float) -> torch.Tensor | float:
    """Mean of ``value`` over all ranks (each rank weighted equally).

    For a sample-weighted mean of per-rank averages, sum ``(mean * n, n)`` and divide instead.

    Example:
        >>> all_reduce_mean(2.5)
        2.5
    """
    if not _group_active():
        return value
    total = all_reduce_sum(_as_tensor(value)) / dist.get_world_size()
    return total if isinstance(value, torch.Tensor) else float(total.item())


def print0(*args: Any, **kwargs: Any) -> None:
    """``print`` on global rank 0 only, flushed so launcher logs keep their order.

    Example:
        >>> print0("epoch", 1)
        epoch 1
    """
    if is_main():
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def rank_zero_only(fn: F) -> F:
    """Decorator: run ``fn`` on rank 0 only; other ranks get None.

    Example:
        >>> @rank_zero_only
        ... def log(msg):
        ...     return msg
        >>> log("hi")
        'hi'
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs) if is_main() else None

    return wrapper  # type: ignore[return-value]


def _as_tensor(value: torch.Tensor | float) -> torch.Tensor:
    """A fresh tensor on the collective's device (NCCL needs CUDA tensors)."""
    world = world_or_none()
    device = world.device if world is not None else torch.device("cpu")
    if isinstance(value, torch.Tensor):
        return value.detach().clone().to(device)
    return torch.tensor(float(value), dtype=torch.float64, device=device)
