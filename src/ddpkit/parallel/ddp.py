"""``strategy="ddp"`` (the default): torch's ``DistributedDataParallel``.

Every rank holds a replica, gradients are averaged by all-reduce during ``backward()``, and
rank 0's initial weights are broadcast at wrap time so replicas start identical. A launched
world of one (``ddpkit run --nproc 1``) wraps too, so one GPU runs what N run; only a process
with no process group (plain ``python train.py``) leaves the model unwrapped, and the training
code is the same either way. DDP's own options pass through unchanged, and ``comm_hook``
compresses the gradient traffic (see :mod:`ddpkit.parallel.commhooks`).

Example:
    >>> sorted(DDP.options)[:2]
    ['broadcast_buffers', 'bucket_cap_mb']
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

from ddpkit.errors import ConfigError
from ddpkit.parallel.base import ModuleWrapperStrategy
from ddpkit.parallel.commhooks import register_comm_hook
from ddpkit.parallel.compiled import uncompiled
from ddpkit.runtime.collectives import has_process_group

if TYPE_CHECKING:
    from ddpkit.env.world import World

DDP_OPTIONS = (
    "bucket_cap_mb",
    "find_unused_parameters",
    "static_graph",
    "gradient_as_bucket_view",
    "broadcast_buffers",
)


class DistributedDataParallelStrategy(ModuleWrapperStrategy):
    """A replica per rank, gradients all-reduced in buckets during backward.

    Example:
        >>> DistributedDataParallelStrategy().uneven_batches
        'join'
    """

    name = "ddp"
    wrapper = DistributedDataParallel
    options = (*DDP_OPTIONS, "comm_hook")
    uneven_batches = "join"

    def wrap(self, model: nn.Module, world: World, options: dict[str, Any]) -> nn.Module:
        model = model.to(world.device)
        if not has_process_group():
            return model
        comm_hook = options.pop("comm_hook", None)
        device_ids = [world.device.index] if world.device.type == "cuda" else None
        wrapped = ExplainedDDP(model, device_ids=device_ids, **options)
        if comm_hook is not None:
            register_comm_hook(wrapped, comm_hook)
        return wrapped

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        model = uncompiled(model)  # compile=True: DDP is inside torch.compile's wrapper
        assert isinstance(model, DistributedDataParallel)
        return model.no_sync()

    def join(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        # Ranks that run out of batches first keep answering the others' all-reduces.
        model = uncompiled(model)
        assert isinstance(model, DistributedDataParallel)
        return Join([model])


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


DDP = DistributedDataParallelStrategy()
