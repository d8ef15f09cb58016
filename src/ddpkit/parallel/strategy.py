"""How the model is parallelized, chosen by name ("ddp", the default, "fsdp", "hsdp", "dp",
"none") or by a strategy object that holds its options:

- ``"ddp"`` / :class:`~ddpkit.parallel.ddp.DDPStrategy`: torch's ``DistributedDataParallel``,
  a replica per rank, gradients averaged by all-reduce during ``backward()``;
- ``"fsdp"`` / :class:`~ddpkit.parallel.fsdp.FSDPStrategy`: FSDP2, parameters and optimizer
  state sharded over the ranks, for models whose training state does not fit one device;
- ``"hsdp"`` / :class:`~ddpkit.parallel.hsdp.HSDPStrategy`: FSDP2 on a (replicate, shard)
  mesh, sharded within a node, replicated across nodes, so only gradients cross between nodes;
- ``"dp"``: torch's ``DataParallel`` (:mod:`ddpkit.parallel.dp`), one process driving every
  visible GPU, kept because the tutorials compare it with DDP;
- ``"none"``: only moved to the device (:mod:`ddpkit.parallel.unwrapped`).

A name is the strategy with its defaults: ``"fsdp"`` is ``FSDPStrategy()``. Each is a
:class:`~ddpkit.parallel.base.Strategy` descriptor in a module of its own, listed in
:data:`~ddpkit.parallel.base.STRATEGY_MODULES`; :func:`strategy_of` answers for any model
which one wrapped it, so the rest of ddpkit asks the descriptor instead of testing types.

Example:
    >>> import torch, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> model = ddpkit.prepare_model(torch.nn.Linear(4, 2))
    >>> type(unwrap_model(model)).__name__, strategy_of(model).name
    ('Linear', 'none')
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, get_args

from torch import nn

from ddpkit._core.log import logger
from ddpkit._core.validate import check_choice
from ddpkit.compiling.wrap import compile_request, compiled, uncompiled
from ddpkit.env.world import World
from ddpkit.errors import ConfigError
from ddpkit.parallel.base import STRATEGY_MODULES, Strategy, StrategyName
from ddpkit.parallel.recompute import (
    ActivationCheckpointing,
    checkpoint_blocks,
    checkpointing_request,
)
from ddpkit.parallel.spellings import refuses_moved_keywords
from ddpkit.parallel.weights import check_start, fill, materialize
from ddpkit.runtime.callbacks import registered_callbacks
from ddpkit.runtime.collectives import has_process_group
from ddpkit.runtime.session import current_world
from ddpkit.runtime.watchdog import watch

STRATEGIES: tuple[StrategyName, ...] = get_args(StrategyName)


@refuses_moved_keywords
def prepare_model(
    model: nn.Module,
    strategy: StrategyName | Strategy = "ddp",
    *,
    sync_batchnorm: bool = False,
    compile: bool | dict[str, Any] = False,
    activation_checkpointing: bool | Sequence[type[nn.Module]] | ActivationCheckpointing = False,
    weights: str | os.PathLike[str] | None = None,
) -> nn.Module:
    """Move ``model`` to this rank's device and wrap it for data-parallel training.

    ``strategy`` is a name (``"ddp"``, the default, ``"fsdp"``, ``"hsdp"``, ``"dp"``,
    ``"none"``) or a strategy object with its options: ``ddpkit.DDPStrategy(bucket_cap_mb=50,
    comm_hook="bf16")``, ``ddpkit.FSDPStrategy(units=(Block,), mixed_precision="bf16")``,
    ``ddpkit.HSDPStrategy(shard_size=2)`` (see the module docstring for when to use which).
    ``sync_batchnorm=True`` converts BatchNorm layers to SyncBatchNorm, so statistics are
    computed over the global batch (in a world of one there is nothing to synchronize).
    ``compile=True`` (or a dict of ``torch.compile`` options) compiles the wrapped model, the
    order DDP and FSDP need (see :mod:`ddpkit.compiling.wrap`); a model compiled
    beforehand is compiled again that way.
    ``activation_checkpointing`` recomputes blocks' activations in backward instead of
    keeping them: ``True`` (the strategy's FSDP units), the block classes, or
    ``ddpkit.ActivationCheckpointing(blocks=blocks, every=2)`` (:mod:`ddpkit.parallel.recompute`).
    ``weights`` (a ``.safetensors`` / ``.pt`` file or a Hugging Face folder) is loaded into
    the model after wrapping; a model built on the meta device needs it, and under FSDP or
    HSDP each rank then holds and reads only its shards (see :mod:`ddpkit.parallel.weights`).
    Call ``ddpkit.init()`` first.

    Example:
        >>> import torch, ddpkit
        >>> _ = ddpkit.init()
        ddpkit: world size 1 ...
        >>> ddpkit.prepare_model(torch.nn.Linear(4, 2), strategy="none")
        Linear(in_features=4, out_features=2, bias=True)
        >>> ddpkit.shutdown()
    """
    descriptor = resolve_strategy(strategy)
    steps = _Steps(
        sync_batchnorm,
        checkpointing_request(activation_checkpointing, descriptor.units),
        check_start(model, weights),
        weights,
    )
    world = current_world()
    model, compile_options = compile_request(model, compile)
    # Wrapping runs collectives (DDP checks the parameters' shapes and broadcasts rank 0's
    # weights; FSDP broadcasts its state): a rank that never gets here is a hang to report.
    with watch(f"prepare_model(strategy={strategy!r})"):
        wrapped = _wrap(model, world, descriptor, steps)
    return compiled(wrapped, compile_options)


@dataclass(frozen=True)
class _Steps:
    """What prepare_model does around the strategy's wrap, checked before any of it runs."""

    sync_batchnorm: bool
    recomputed: ActivationCheckpointing | None
    empty: bool  # built on the meta device
    weights: str | os.PathLike[str] | None


def _wrap(model: nn.Module, world: World, descriptor: Strategy, steps: _Steps) -> nn.Module:
    for callback in registered_callbacks():  # before wrapping evens the ranks' weights out
        callback.on_model_built(model)
    if steps.sync_batchnorm:
        model = _convert_sync_batchnorm(model, world)
    if steps.recomputed is not None:
        _checkpoint_activations(model, steps.recomputed)
    if steps.empty and not (descriptor.sharded and has_process_group()):
        materialize(model, world.device)  # held whole on this rank: storage for all of it
    wrapped = descriptor.wrap(model, world)
    if steps.weights is not None:
        fill(descriptor.unwrap(wrapped), steps.weights, world.device)
    return wrapped


def resolve_strategy(strategy: object) -> Strategy:
    """The descriptor ``strategy`` stands for: a name's (its defaults), or the object itself.

    Example:
        >>> resolve_strategy("fsdp")
        FSDPStrategy()
    """
    if isinstance(strategy, Strategy):
        return strategy
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        names = ", ".join(repr(name) for name in STRATEGIES)
        raise ConfigError(
            f"unknown strategy {strategy!r}; choose one of {names}, or a strategy object with "
            "options, e.g. ddpkit.FSDPStrategy(units=(Block,)) or ddpkit.DDPStrategy(...)"
        )
    return get_strategy(strategy)


def get_strategy(name: str) -> Strategy:
    """The descriptor of strategy ``name`` (its module is imported on first use).

    Example:
        >>> get_strategy("ddp").uneven_batches
        'join'
    """
    check_choice("strategy", name, STRATEGIES)
    module, _, attribute = STRATEGY_MODULES[name].partition(":")
    descriptor = getattr(importlib.import_module(module), attribute)
    assert isinstance(descriptor, Strategy)
    return descriptor


def strategy_of(model: nn.Module) -> Strategy:
    """The strategy whose wrapper ``model`` is (``"none"`` for a plain module).

    Example:
        >>> strategy_of(nn.Linear(2, 2)).name
        'none'
    """
    model = uncompiled(model)  # torch.compile's wrapper is around the strategy's
    own = getattr(model, "ddpkit_strategy", None)  # a container that answers for itself
    if isinstance(own, Strategy):
        return own
    return next(s for s in map(get_strategy, STRATEGY_MODULES) if s.owns(model))


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's own module inside a DDP/DP wrapper (or the model itself when unwrapped).

    Its ``state_dict()`` has no ``module.`` prefix, so it loads without ddpkit.

    Example:
        >>> unwrap_model(nn.Linear(2, 2)).in_features
        2
    """
    model = uncompiled(model)
    return strategy_of(model).unwrap(model)


def _checkpoint_activations(model: nn.Module, request: ActivationCheckpointing) -> None:
    count = checkpoint_blocks(model, request.classes(), request.every)
    names = ", ".join(c.__name__ for c in request.classes())
    if count == 0:
        raise ConfigError(f"activation_checkpointing: the model has no {names} module to recompute")
    logger.info(f"activation checkpointing: {count} {names} block(s) recomputed in backward")


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
