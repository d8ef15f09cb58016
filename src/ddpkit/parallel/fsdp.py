"""``strategy="fsdp"``, or :class:`FSDPStrategy` with options: FSDP2
(``torch.distributed.fsdp.fully_shard``), parameters, gradients and optimizer state sharded
over the ranks, for models whose training state does not fit one device.

Each *unit* (a submodule passed to ``fully_shard``) gathers its parameters just before its
forward and backward and frees them after, so peak memory is one unit's full parameters plus
the shards. By default the whole model is one unit; pass the block classes of a deep model
(``FSDPStrategy(units=(TransformerBlock,))``) so only one block is gathered at a time, as
torchtitan does. Rank 0's initial weights are broadcast before sharding, so every rank starts
from the same model even when each built it with a different random seed. It works on CPU
with gloo.
A launched world of one (``ddpkit run --nproc 1``) shards over its one rank, so one GPU runs
the sharded path (DTensors, sharded checkpoints) that N run; only a process with no process
group leaves the model whole, as DDP leaves it unwrapped.

torch's FSDP package (with DTensor) takes most of a second to import, so it is imported when
a model is sharded, not before: a job that never asks for FSDP never pays for it.

Example:
    >>> import torch
    >>> is_sharded(torch.nn.Linear(2, 2))
    False
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ddpkit.compiling.wrap import uncompiled
from ddpkit.errors import ConfigError
from ddpkit.parallel.base import Strategy, checked_options
from ddpkit.parallel.recompute import unit_of
from ddpkit.parallel.shardprecision import policy_precision, policy_text, shard_policy
from ddpkit.parallel.weights import on_meta
from ddpkit.runtime.collectives import has_process_group

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ddpkit.env.world import World

_FSDP_MODULE = "torch.distributed.fsdp"


@checked_options
@dataclass(frozen=True, repr=False, kw_only=True)
class FSDPStrategy(Strategy):
    """Parameters, gradients and optimizer state sharded; gathered one unit at a time.

    ``units``: the block classes sharded as units of their own (default: the whole model is
    one); ``mixed_precision``: ``"bf16"`` (bf16 parameters for compute, fp32 gradient
    reduction) or a torch ``MixedPrecisionPolicy`` (:mod:`ddpkit.parallel.shardprecision`);
    ``reshard_after_forward=False`` keeps each unit gathered from forward to backward
    (faster, more memory: ZeRO-2 instead of ZeRO-3).

    Example:
        >>> import torch, ddpkit
        >>> ddpkit.FSDPStrategy(units=(torch.nn.Linear,))
        FSDPStrategy(units=(Linear,))
        >>> ddpkit.FSDPStrategy().sharded, ddpkit.FSDPStrategy().replicas_identical
        (True, False)
    """

    name = "fsdp"
    replicas_identical = False
    checkpoint_kind = "sharded"
    uneven_batches = "refuse"

    units: tuple[type[nn.Module], ...] = ()
    mixed_precision: Any = None  # "bf16", "fp32", a MixedPrecisionPolicy, or None
    reshard_after_forward: bool = True

    def __post_init__(self) -> None:
        check_units(self.units)
        object.__setattr__(self, "units", tuple(self.units))  # a list given: hashable
        shard_policy(self.mixed_precision)  # a bad value is refused here, before any wrap

    @property
    def policy(self) -> Any:
        """The ``MixedPrecisionPolicy`` FSDP is given (None: its default)."""
        return shard_policy(self.mixed_precision)

    @property
    def layout(self) -> str:
        return policy_text(self.policy)

    @property
    def compute_precision(self) -> str | None:
        return policy_precision(self.policy)

    def wrap(self, model: nn.Module, world: World) -> nn.Module:
        wrapped = self.shard(model, world)
        if has_process_group():  # strategy_of asks the model first
            wrapped.ddpkit_strategy = self  # type: ignore[assignment]
        return wrapped

    def shard(self, model: nn.Module, world: World, mesh: DeviceMesh | None = None) -> nn.Module:
        """:func:`shard_model` with this strategy's options, over ``mesh`` (None: every rank)."""
        return shard_model(model, world, self.units, mesh=mesh, mp_policy=self.policy,
                           reshard_after_forward=self.reshard_after_forward)  # fmt: skip

    def owns(self, model: nn.Module) -> bool:
        return is_sharded(model)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        return _no_gradient_sync(uncompiled(model))

    def full_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Gathered to CPU on every rank (a collective: all ranks call it)."""
        # DCP's state-dict helpers load FSDP's world: imported only for a sharded model.
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=options)
        return {name: t.detach().cpu().clone() for name, t in state.items() if torch.is_tensor(t)}


def shard_model(
    model: nn.Module,
    world: World,
    units: Sequence[type[nn.Module]] = (),
    *,
    reshard_after_forward: bool = True,
    mesh: DeviceMesh | None = None,
    mp_policy: Any = None,
) -> nn.Module:
    """Move ``model`` to the world's device and shard it with FSDP2.

    ``units`` are module classes that each become their own FSDP unit (innermost first);
    the root is always one. ``reshard_after_forward=False`` keeps parameters gathered from
    forward to backward: faster, more memory (ZeRO-2 instead of ZeRO-3). ``mesh`` is FSDP's
    DeviceMesh: None shards over every rank, a 2-D (replicate, shard) mesh is HSDP
    (:mod:`ddpkit.parallel.hsdp`). ``mp_policy`` is a ``MixedPrecisionPolicy``
    (:mod:`ddpkit.parallel.shardprecision`).

    Example::

        net = shard_model(net, world, units=(TransformerBlock,))   # 2 or more ranks
    """
    check_units(units)
    empty = on_meta(model)  # sharded while empty: each rank then gets storage for its shards
    model = model if empty else model.to(world.device)
    if not has_process_group():
        return model
    from torch.distributed.fsdp import fully_shard  # only when a model is sharded

    if not empty:
        broadcast_module_state(model)
    policy = {"mp_policy": mp_policy} if mp_policy is not None else {}
    for module in unit_modules(model, units):
        fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward, **policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, **policy)
    return model


def unit_modules(model: nn.Module, units: Sequence[type[nn.Module]]) -> list[nn.Module]:
    """The submodules of ``model`` that become FSDP units: those of the ``units`` classes with
    parameters, a block's activation-checkpoint wrapper standing for it (torchtitan's order).

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> [type(m).__name__ for m in unit_modules(net, [torch.nn.Linear])]
        ['Linear']
    """
    wrapped = {id(unit_of(m)) for m in model.modules() if unit_of(m) is not m}
    return [
        module
        for module in list(model.modules())[1:]
        if id(module) not in wrapped
        and isinstance(unit_of(module), tuple(units))
        and any(True for _ in module.parameters())
    ]


def is_sharded(model: nn.Module) -> bool:
    """True for a model prepared with ``strategy="fsdp"`` on 2 or more ranks.

    Without torch's FSDP package imported, no model can be sharded: nothing is imported.

    Example:
        >>> is_sharded(torch.nn.Linear(2, 2))
        False
    """
    fsdp = sys.modules.get(_FSDP_MODULE)
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


@torch.no_grad()
def broadcast_module_state(model: nn.Module, src: int = 0) -> None:
    """Overwrite every parameter and buffer with rank ``src``'s (no-op without a group).

    Example:
        >>> broadcast_module_state(torch.nn.Linear(2, 2))  # no process group: nothing to do
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=src)


def check_units(units: Sequence[type[nn.Module]]) -> None:
    """Refuse ``units`` that are not module classes.

    Example:
        >>> check_units([torch.nn.Linear])
    """
    if isinstance(units, type) or not isinstance(units, Sequence):
        raise ConfigError(
            f"units must be a tuple of nn.Module classes, e.g. (MyBlock,); got {units!r}"
        )
    bad = [u for u in units if not (isinstance(u, type) and issubclass(u, nn.Module))]
    if bad:
        raise ConfigError(
            f"units must be nn.Module classes (e.g. FSDPStrategy(units=(MyBlock,))); got {bad!r}"
        )


@contextlib.contextmanager
def _no_gradient_sync(model: nn.Module) -> Iterator[None]:
    """FSDP's counterpart of DDP's ``no_sync()``: keep gradients local for accumulation."""
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


FSDP = FSDPStrategy()  # strategy="fsdp"
