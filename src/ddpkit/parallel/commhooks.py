"""DDP gradient communication hooks chosen by name: ``"fp16"``, ``"bf16"``, ``"powersgd"``.

A hook replaces DDP's plain all-reduce of each gradient bucket. The compression hooks halve
the bytes on the wire by casting the bucket to 16 bits, all-reducing, and casting back:
worth it when the network, not the arithmetic, is the bottleneck (gloo on loopback moves
under 1 GB/s). torch ships ``bf16_compress_hook`` but refuses to register it unless NCCL is
in use, although gloo all-reduces bfloat16 fine; ddpkit's own bf16 hook does the same
computation with ``torch.distributed.all_reduce`` and works on both backends. PowerSGD
(torch's, rank-``powersgd_rank`` low-rank approximation with error feedback) cuts traffic
much further at some accuracy cost; its first ``powersgd_warmup`` steps are uncompressed.

Example:
    >>> sorted(COMM_HOOKS)
    ['bf16', 'fp16', 'powersgd']
"""

# No `from __future__ import annotations` here: DDP inspects a hook's annotations and
# accepts only the real GradBucket and Future[Tensor] types, not their names as strings.
from collections.abc import Callable
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist
from torch.distributed import GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from ddpkit._core.log import logger
from ddpkit._core.validate import check_choice

CommHook = Literal["fp16", "bf16", "powersgd"]
COMM_HOOKS: tuple[CommHook, ...] = get_args(CommHook)
Hook = Callable[[Any, GradBucket], torch.futures.Future[torch.Tensor]]


def register_comm_hook(
    model: DistributedDataParallel,
    name: str,
    *,
    powersgd_rank: int = 1,
    powersgd_warmup: int = 10,
) -> None:
    """Install the hook called ``name`` on a DDP-wrapped ``model``.

    Example::

        register_comm_hook(ddp_model, "bf16")
    """
    check_choice("comm_hook", name, COMM_HOOKS)
    if name == "powersgd":
        _warn_if_gloo()
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=max(powersgd_warmup, 2),  # torch requires >= 2
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return
    dtype = torch.float16 if name == "fp16" else torch.bfloat16
    model.register_comm_hook(None, compress_hook(dtype))


def _warn_if_gloo() -> None:
    if dist.get_backend() == "gloo":  # the logger speaks for rank 0
        logger.warning(
            "warning: torch's PowerSGD hook on gloo has been seen to abort at process "
            "exit ('terminate called without an active exception') on layers 512 wide or "
            'more; comm_hook="bf16" or "fp16" is the safer compression on gloo'
        )


def compress_hook(dtype: torch.dtype) -> Hook:
    """A hook that all-reduces each bucket in ``dtype`` and returns the mean in full precision.

    Dividing by the world size before the cast keeps the sum in range for fp16.

    Example:
        >>> compress_hook(torch.bfloat16).__name__
        'bfloat16_compress_hook'
    """

    def hook(process_group: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        group = process_group if process_group is not None else dist.group.WORLD
        full: torch.Tensor = bucket.buffer()
        compressed = full.div(dist.get_world_size(group)).to(dtype)
        work = dist.all_reduce(compressed, group=group, async_op=True)
        assert work is not None  # async_op=True always returns a Work handle

        def decompress(future: torch.futures.Future[Any]) -> torch.Tensor:
            reduced: torch.Tensor = future.value()[0]
            full.copy_(reduced)  # the bucket's own storage: no extra allocation
            return full

        result: torch.futures.Future[torch.Tensor] = work.get_future().then(decompress)
        return result

    hook.__name__ = f"{str(dtype).removeprefix('torch.')}_compress_hook"
    return hook
