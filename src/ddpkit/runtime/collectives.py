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

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, overload

import torch
import torch.distributed as dist

from ddpkit._core.torcherrors import summarize_mismatch
from ddpkit.errors import CollectiveMismatchError
from ddpkit.runtime.session import world_or_none
from ddpkit.runtime.watchdog import watch

F = TypeVar("F", bound=Callable[..., Any])


def has_process_group() -> bool:
    """True when this process joined a process group: a launcher started it, even as the only
    worker (``ddpkit run --nproc 1``). A plain ``python train.py`` has none.

    Example:
        >>> has_process_group()
        False
    """
    return dist.is_available() and dist.is_initialized()


def _group_active() -> bool:
    return has_process_group() and dist.get_world_size() > 1


def get_rank() -> int:
    """Global rank of this process (0 without a process group).

    Example:
        >>> get_rank()
        0
    """
    if has_process_group():
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
        with _collective("barrier()"):
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
    return _all_reduce(value, dist.ReduceOp.SUM, "all_reduce_sum")


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
    return _all_reduce(value, dist.ReduceOp.MAX, "all_reduce_max")


def _all_reduce(value: torch.Tensor | float, op: Any, name: str) -> torch.Tensor | float:
    if not _group_active():
        return value
    tensor = _as_tensor(value)
    with _collective(f"{name}({describe_tensor(tensor)})"):
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
    # The sum comes back on the input's device (NCCL reduces on the GPU, the input may not be).
    return all_reduce_sum(value) / dist.get_world_size()


def all_gather_rows(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``tensor``, by rank; their first dimensions may differ.

    Shapes beyond the first dimension and the dtype must agree (gloo and NCCL move equal
    sizes, so rows are padded for the exchange and cut back after).

    Example:
        >>> all_gather_rows(torch.tensor([[1, 2]]))
        [tensor([[1, 2]])]
    """
    if not _group_active():
        return [tensor]
    local = _as_tensor(tensor)
    counts = all_gather_rows_count(local.shape[0])
    if max(counts) == 0:  # nothing anywhere: no empty tensors for the backend to move
        return [tensor for _ in counts]
    padded = torch.zeros((max(counts), *local.shape[1:]), dtype=local.dtype, device=local.device)
    padded[: local.shape[0]] = local
    gathered = [torch.empty_like(padded) for _ in counts]
    with _collective(f"all_gather({describe_tensor(padded)})"):
        dist.all_gather(gathered, padded)
    return [rows[:count].to(tensor.device) for rows, count in zip(gathered, counts, strict=True)]


def all_gather_same(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor`` stacked by rank, in one all-gather: the shapes must agree (a
    fixed-size row of numbers, say). Comes back on the CPU.

    Example:
        >>> all_gather_same(torch.tensor([1.0, 2.0]))
        tensor([[1., 2.]])
    """
    if not _group_active():
        return tensor.detach().cpu().unsqueeze(0)
    local = _as_tensor(tensor)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    with _collective(f"all_gather({describe_tensor(local)})"):
        dist.all_gather(gathered, local)
    return torch.stack(gathered).cpu()


def all_gather_rows_count(count: int) -> list[int]:
    """Every rank's ``count``, by rank.

    Example:
        >>> all_gather_rows_count(3)
        [3]
    """
    if not _group_active():
        return [count]
    mine = _as_tensor(torch.tensor([count], dtype=torch.int64))
    counts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    with _collective("all_gather(int64[1])"):
        dist.all_gather(counts, mine)
    return [int(c.item()) for c in counts]


def broadcast_from_main(tensor: torch.Tensor) -> torch.Tensor:
    """Rank 0's ``tensor`` on every rank (a new tensor; the input is not modified).

    Example:
        >>> broadcast_from_main(torch.tensor([5.0]))
        tensor([5.])
    """
    if not _group_active():
        return tensor
    local = _as_tensor(tensor)
    with _collective(f"broadcast({describe_tensor(local)})"):
        dist.broadcast(local, src=0)
    return local.to(tensor.device)


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


@contextlib.contextmanager
def _collective(label: str) -> Iterator[None]:
    """Watched by the hang watchdog; torch's mismatch check (DETAIL mode) as a typed error."""
    with watch(label):
        try:
            yield
        except RuntimeError as err:
            mismatch = summarize_mismatch(str(err))
            if mismatch is None:
                raise
            raise CollectiveMismatchError(f"{mismatch}; this rank called {label}") from None


def describe_tensor(tensor: torch.Tensor) -> str:
    """dtype and shape, as hang and mismatch reports show them.

    Example:
        >>> describe_tensor(torch.zeros(2, 3))
        'float32[2, 3]'
    """
    return f"{str(tensor.dtype).removeprefix('torch.')}[{', '.join(map(str, tensor.shape))}]"


def _as_tensor(value: torch.Tensor | float) -> torch.Tensor:
    """A fresh tensor on the collective's device (NCCL needs CUDA tensors)."""
    world = world_or_none()
    device = world.device if world is not None else torch.device("cpu")
    if isinstance(value, torch.Tensor):
        return value.detach().clone().to(device)
    return torch.tensor(float(value), dtype=torch.float64, device=device)
