"""How the model is parallelized, chosen by name: "ddp" (default), "fsdp", "dp" or "none".

- ``"ddp"``: torch's ``DistributedDataParallel``. Every rank holds a replica, gradients are
  averaged by all-reduce during ``backward()``, and rank 0's initial weights are broadcast at
  wrap time so replicas start identical. In a world of one there is nothing to average, so
  the model is left unwrapped; the training code is the same either way.
- ``"fsdp"``: FSDP2 (``fully_shard``), parameters and optimizer state sharded over the ranks
  (see :mod:`ddpkit.parallel.fsdp`); for models whose training state does not fit one device.
- ``"dp"``: torch's ``DataParallel``, one process driving every visible GPU. Slower than DDP
  (one Python thread feeds all GPUs, and the model is copied to them every step), kept
  because the tutorials compare the two. Without two GPUs it says so and runs unwrapped.
- ``"none"``: only moved to the device.

Example:
    >>> import torch, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> model = ddpkit.prepare_model(torch.nn.Linear(4, 2))
    >>> type(unwrap_model(model)).__name__
    'Linear'
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

from ddpkit._core.validate import check_choice
from ddpkit.env.world import World
from ddpkit.errors import ConfigError
from ddpkit.parallel.commhooks import COMM_HOOKS, register_comm_hook
from ddpkit.parallel.fsdp import shard_model
from ddpkit.runtime.session import current_world

STRATEGIES = ("ddp", "fsdp", "dp", "none")
DDP_OPTIONS = (
    "bucket_cap_mb",
    "find_unused_parameters",
    "static_graph",
    "gradient_as_bucket_view",
    "broadcast_buffers",
)


def prepare_model(
    model: nn.Module,
    strategy: str = "ddp",
    *,
    sync_batchnorm: bool = False,
    comm_hook: str | None = None,
    fsdp_units: Sequence[type[nn.Module]] = (),
    **ddp_options: Any,
) -> nn.Module:
    """Move ``model`` to this rank's device and wrap it for data-parallel training.

    ``strategy`` is ``"ddp"`` (default), ``"fsdp"``, ``"dp"`` or ``"none"`` (see the module
    docstring for when to use which). DDP's own options pass through unchanged:
    ``bucket_cap_mb``, ``find_unused_parameters``, ``static_graph``,
    ``gradient_as_bucket_view``, ``broadcast_buffers``; ``comm_hook`` compresses DDP's
    gradient traffic (``"fp16"``, ``"bf16"``, ``"powersgd"``; see :mod:`ddpkit.parallel.commhooks`).
    ``fsdp_units`` are the module classes FSDP shards as separate units. ``sync_batchnorm=True``
    converts BatchNorm layers to SyncBatchNorm, so statistics are computed over the global
    batch (in a world of one there is nothing to synchronize). Call ``ddpkit.init()`` first.

    Example:
        >>> import torch, ddpkit
        >>> _ = ddpkit.init()
        ddpkit: world size 1 ...
        >>> ddpkit.prepare_model(torch.nn.Linear(4, 2), strategy="none")
        Linear(in_features=4, out_features=2, bias=True)
        >>> ddpkit.shutdown()
    """
    check_choice("strategy", strategy, STRATEGIES)
    _check_options(strategy, ddp_options, comm_hook, fsdp_units)
    world = current_world()
    _record_build(model)
    if sync_batchnorm:
        model = _convert_sync_batchnorm(model, world)
    if strategy == "fsdp":
        return shard_model(model, world, fsdp_units)
    if strategy == "dp":
        return _data_parallel(model, world)
    model = model.to(world.device)
    if strategy == "none" or world.world_size == 1:
        return model
    device_ids = [world.device.index] if world.device.type == "cuda" else None
    wrapped = ExplainedDDP(model, device_ids=device_ids, **ddp_options)
    if comm_hook is not None:
        register_comm_hook(wrapped, comm_hook)
    return wrapped


def _record_build(model: nn.Module) -> None:
    """Under ``ddpkit verify``: each rank's weights before wrapping evens them out."""
    from ddpkit.tools.verify.recorder import active_recorder  # it unwraps models: a cycle at import

    recorder = active_recorder()
    if recorder is not None:
        recorder.model_built(model)


def _convert_sync_batchnorm(model: nn.Module, world: World) -> nn.Module:
    if world.world_size == 1:
        return model
    if world.device.type != "cuda":
        raise ConfigError(
            "sync_batchnorm=True needs CUDA devices: torch's SyncBatchNorm does not run on "
            f"{world.device.type}. Leave it off on CPU (each rank then normalizes over its "
            "own batch), or train on GPUs."
        )
    converted: nn.Module = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # type: ignore[no-untyped-call]
    return converted


def _data_parallel(model: nn.Module, world: World) -> nn.Module:
    if world.world_size > 1:
        raise ConfigError(
            f'strategy="dp" drives all GPUs from one process, but this job has '
            f'{world.world_size} processes; use strategy="ddp" (one process per GPU), '
            "or start a single process"
        )
    gpus = torch.cuda.device_count()
    if gpus < 2:
        print(
            f'ddpkit: strategy="dp" needs 2 or more GPUs and {gpus} is visible; '
            f"the model runs unwrapped on {world.device}",
            flush=True,
        )
        return model.to(world.device)
    return DataParallel(model.to("cuda:0"))


class ExplainedDDP(DistributedDataParallel):
    """torch's DDP, whose unused-parameter error names the parameters and the fix.

    Example:
        >>> issubclass(ExplainedDDP, DistributedDataParallel)
        True
    """

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        try:
            return super().forward(*inputs, **kwargs)  # type: ignore[no-untyped-call]
        except RuntimeError as err:
            if "Expected to have finished reduction" not in str(err):
                raise
            raise ConfigError(_unused_parameters_message(self.module)) from err


def _unused_parameters_message(module: nn.Module) -> str:
    # After the last backward, the parameters that took no part in the loss have no gradient.
    unused = [n for n, p in module.named_parameters() if p.requires_grad and p.grad is None]
    names = ", ".join(unused[:10]) + (f" and {len(unused) - 10} more" if len(unused) > 10 else "")
    return (
        f"DDP found parameters that received no gradient in the last step: {names or '(unknown)'}"
        ". Either make every parameter take part in the loss, or pass "
        "find_unused_parameters=True to ddpkit.prepare_model (it costs a graph traversal per "
        "step); static_graph=True also works when the unused set never changes."
    )


def _check_options(
    strategy: str,
    ddp_options: dict[str, Any],
    comm_hook: str | None,
    fsdp_units: Sequence[type[nn.Module]],
) -> None:
    unknown = sorted(set(ddp_options) - set(DDP_OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown DDP option(s) {', '.join(unknown)}; accepted: {', '.join(DDP_OPTIONS)}"
        )
    if comm_hook is not None:
        check_choice("comm_hook", comm_hook, COMM_HOOKS)  # in a world of one too
    ddp_only = [*ddp_options, *(["comm_hook"] if comm_hook is not None else [])]
    if strategy != "ddp" and ddp_only:
        raise ConfigError(f'{", ".join(ddp_only)} only apply to strategy="ddp", not {strategy!r}')
    if strategy != "fsdp" and fsdp_units:
        raise ConfigError(f'fsdp_units only applies to strategy="fsdp", not {strategy!r}')


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's own module inside a DDP wrapper (or the model itself when unwrapped).

    Its ``state_dict()`` has no ``module.`` prefix, so it loads without ddpkit.

    Example:
        >>> import torch
        >>> unwrap_model(torch.nn.Linear(2, 2)).in_features
        2
    """
    wrapped = isinstance(model, (DistributedDataParallel, DataParallel))
    inner = model.module if wrapped else model
    assert isinstance(inner, nn.Module)
    return inner
