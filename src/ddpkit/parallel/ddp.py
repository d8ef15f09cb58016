"""``strategy="ddp"`` (the default), or :class:`DDPStrategy` with options: torch's
``DistributedDataParallel``.

Every rank holds a replica, gradients are averaged by all-reduce during ``backward()``, and
rank 0's initial weights are broadcast at wrap time so replicas start identical. A launched
world of one (``ddpkit run --nproc 1``) wraps too, so one GPU runs what N run; only a process
with no process group (plain ``python train.py``) leaves the model unwrapped, and the training
code is the same either way. DDP's own options are the strategy's fields, passed to torch
unchanged, and ``comm_hook`` compresses the gradient traffic (see
:mod:`ddpkit.parallel.commhooks`).

Example:
    >>> DDPStrategy(bucket_cap_mb=50, comm_hook="bf16")
    DDPStrategy(bucket_cap_mb=50, comm_hook='bf16')
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

from ddpkit._compat.ddpbuckets import fix_bucket_layout
from ddpkit._core.validate import check_choice
from ddpkit.compiling.wrap import uncompiled
from ddpkit.errors import ConfigError
from ddpkit.parallel.base import ModuleWrapperStrategy, checked_options
from ddpkit.parallel.commhooks import COMM_HOOKS, CommHook, register_comm_hook
from ddpkit.parallel.options import bounded
from ddpkit.runtime.collectives import has_process_group

if TYPE_CHECKING:
    from ddpkit.env.world import World


@checked_options
@dataclass(frozen=True, repr=False, kw_only=True)
class DDPStrategy(ModuleWrapperStrategy):
    """A replica per rank, gradients all-reduced in buckets during backward.

    The fields are torch's ``DistributedDataParallel`` options of the same names
    (``bucket_cap_mb=None``: torch's 25 MB), and ``comm_hook`` (``"fp16"``, ``"bf16"``,
    ``"powersgd"``) compresses each bucket's all-reduce.

    Example:
        >>> import ddpkit
        >>> ddpkit.DDPStrategy(static_graph=True).uneven_batches
        'join'
    """

    name = "ddp"
    wrapper = DistributedDataParallel
    uneven_batches = "join"

    bucket_cap_mb: float | None = bounded(None, above=0, means="MB a gradient bucket holds")
    find_unused_parameters: bool = False
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    broadcast_buffers: bool = True
    comm_hook: CommHook | None = None

    def __post_init__(self) -> None:
        if self.comm_hook is not None:  # refused here, in a world of one too
            check_choice("comm_hook", self.comm_hook, COMM_HOOKS)

    def wrap(self, model: nn.Module, world: World) -> nn.Module:
        model = model.to(world.device)
        if not has_process_group():
            return model
        device_ids = [world.device.index] if world.device.type == "cuda" else None
        wrapped = ExplainedDDP(model, device_ids=device_ids, **self._torch_options())
        fix_bucket_layout(wrapped)  # a resumed run sums as an uninterrupted one, at any size
        if self.comm_hook is not None:
            register_comm_hook(wrapped, self.comm_hook)
        wrapped.ddpkit_strategy = self  # type: ignore[assignment]  # strategy_of asks it
        return wrapped

    def _torch_options(self) -> dict[str, Any]:
        """The options given, for torch's DDP: a default is left to torch (a newer torch warns
        of some options, ``broadcast_buffers``, whenever they are passed at all)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "comm_hook" and getattr(self, f.name) != f.default
        }

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
        ". Either make every parameter take part in the loss, or prepare the model with "
        "ddpkit.DDPStrategy(find_unused_parameters=True) (it costs a graph traversal per "
        "step); DDPStrategy(static_graph=True) also works when the unused set never changes."
    )


DDP = DDPStrategy()  # strategy="ddp"
