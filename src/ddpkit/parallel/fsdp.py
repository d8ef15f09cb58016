"""FSDP2 (``torch.distributed.fsdp.fully_shard``): parameters, gradients and optimizer state
sharded over the ranks, for models whose training state does not fit one device.

Each *unit* (a submodule passed to ``fully_shard``) gathers its parameters just before its
forward and backward and frees them after, so peak memory is one unit's full parameters plus
the shards. By default the whole model is one unit; pass the block classes of a deep model
(``units=(TransformerBlock,)``) so only one block is gathered at a time, as torchtitan does.
Rank 0's initial weights are broadcast before sharding, so every rank starts from the same
model even when each built it with a different random seed. It works on CPU with gloo. In a
world of one there is nothing to shard over, so the model is left whole, as DDP leaves it
unwrapped; the training code is the same either way.

Example:
    >>> import torch, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> model = shard_model(torch.nn.Linear(4, 2), ddpkit.current_world())
    >>> is_sharded(model)  # one process: nothing to shard over
    False
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

from ddpkit.env.world import World
from ddpkit.errors import ConfigError


def shard_model(
    model: nn.Module,
    world: World,
    units: Sequence[type[nn.Module]] = (),
    *,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Move ``model`` to the world's device and shard it with FSDP2.

    ``units`` are module classes that each become their own FSDP unit (innermost first);
    the root is always one. ``reshard_after_forward=False`` keeps parameters gathered from
    forward to backward: faster, more memory (ZeRO-2 instead of ZeRO-3).

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        >>> net = shard_model(net, world, units=(torch.nn.Linear,))  # doctest: +SKIP
        >>> [is_sharded(m) for m in net]  # doctest: +SKIP
        [True, True]
    """
    _check_units(units)
    model = model.to(world.device)
    if world.world_size == 1:
        return model
    broadcast_module_state(model)
    for module in list(model.modules())[1:]:
        if isinstance(module, tuple(units)) and any(True for _ in module.parameters()):
            fully_shard(module, reshard_after_forward=reshard_after_forward)
    fully_shard(model, reshard_after_forward=reshard_after_forward)
    return model


def is_sharded(model: nn.Module) -> bool:
    """True for a model prepared with ``strategy="fsdp"``.

    Example:
        >>> is_sharded(torch.nn.Linear(2, 2))
        False
    """
    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def no_gradient_sync(model: nn.Module) -> Iterator[None]:
    """FSDP's counterpart of DDP's ``no_sync()``: keep gradients local for accumulation.

    Example:
        >>> with no_gradient_sync(fsdp_model):  # doctest: +SKIP
        ...     loss.backward()
    """
    assert isinstance(model, FSDPModule)
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


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


def _check_units(units: Sequence[type[nn.Module]]) -> None:
    bad = [u for u in units if not (isinstance(u, type) and issubclass(u, nn.Module))]
    if bad:
        raise ConfigError(
            f"fsdp_units must be nn.Module classes (e.g. fsdp_units=(MyBlock,)); got {bad!r}"
        )
