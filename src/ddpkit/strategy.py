"""How the model is parallelized, chosen by name: ``"ddp"`` (default) or ``"none"``.

DDP is torch's ``DistributedDataParallel``: every rank holds a replica, gradients are averaged
by all-reduce during ``backward()``, and rank 0's initial weights are broadcast at wrap time so
replicas start identical. In a world of one there is nothing to average, so the model is left
unwrapped; the training code is the same either way.

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

from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddpkit.errors import ConfigError
from ddpkit.rendezvous import current_world

STRATEGIES = ("ddp", "none")
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
    **ddp_options: Any,
) -> nn.Module:
    """Move ``model`` to this rank's device and wrap it for data-parallel training.

    ``strategy="ddp"`` wraps in DistributedDataParallel when the world has more than one
    process; ``"none"`` only moves the model. DDP's own options pass through unchanged:
    ``bucket_cap_mb``, ``find_unused_parameters``, ``static_graph``,
    ``gradient_as_bucket_view``, ``broadcast_buffers``. ``sync_batchnorm=True`` converts
    BatchNorm layers to SyncBatchNorm, so statistics are computed over the global batch (in a
    world of one there is nothing to synchronize and the layers stay as they are).
    Call ``ddpkit.init()`` first.

    Example:
        >>> import torch, ddpkit
        >>> _ = ddpkit.init()
        ddpkit: world size 1 ...
        >>> ddpkit.prepare_model(torch.nn.Linear(4, 2), strategy="none")
        Linear(in_features=4, out_features=2, bias=True)
        >>> ddpkit.shutdown()
    """
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"unknown strategy {strategy!r}; choose one of {', '.join(repr(s) for s in STRATEGIES)}"
        )
    _check_ddp_options(ddp_options)
    world = current_world()
    if sync_batchnorm and world.world_size > 1:
        if world.device.type != "cuda":
            raise ConfigError(
                "sync_batchnorm=True needs CUDA devices: torch's SyncBatchNorm does not run on "
                f"{world.device.type}. Leave it off on CPU (each rank then normalizes over its "
                "own batch), or train on GPUs."
            )
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # type: ignore[no-untyped-call]
    model = model.to(world.device)
    if strategy == "none" or world.world_size == 1:
        return model
    device_ids = [world.device.index] if world.device.type == "cuda" else None
    return ExplainedDDP(model, device_ids=device_ids, **ddp_options)


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


def _check_ddp_options(options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(DDP_OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown DDP option(s) {', '.join(unknown)}; accepted: {', '.join(DDP_OPTIONS)}"
        )


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's own module inside a DDP wrapper (or the model itself when unwrapped).

    Its ``state_dict()`` has no ``module.`` prefix, so it loads without ddpkit.

    Example:
        >>> import torch
        >>> unwrap_model(torch.nn.Linear(2, 2)).in_features
        2
    """
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    assert isinstance(inner, nn.Module)
    return inner
