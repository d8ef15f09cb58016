"""How the model is parallelized, chosen by name: "ddp" (default), "fsdp", "hsdp", "dp" or
"none".

- ``"ddp"``: torch's ``DistributedDataParallel`` (:mod:`ddpkit.parallel.ddp`): a replica per
  rank, gradients averaged by all-reduce during ``backward()``;
- ``"fsdp"``: FSDP2 (:mod:`ddpkit.parallel.fsdp`): parameters and optimizer state sharded
  over the ranks, for models whose training state does not fit one device;
- ``"hsdp"``: FSDP2 on a (replicate, shard) mesh (:mod:`ddpkit.parallel.hsdp`): sharded within
  a node, replicated across nodes, so only gradients cross between nodes;
- ``"dp"``: torch's ``DataParallel`` (:mod:`ddpkit.parallel.dp`), one process driving every
  visible GPU, kept because the tutorials compare it with DDP;
- ``"none"``: only moved to the device (:mod:`ddpkit.parallel.unwrapped`).

Each is a :class:`~ddpkit.parallel.base.Strategy` descriptor in a module of its own, listed
in :data:`STRATEGY_MODULES`; :func:`strategy_of` answers for any model which one wrapped it,
so the rest of ddpkit asks the descriptor instead of testing types.

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
from ddpkit.env.world import World
from ddpkit.errors import ConfigError
from ddpkit.parallel.base import Strategy, StrategyName
from ddpkit.parallel.commhooks import COMM_HOOKS, CommHook
from ddpkit.parallel.compiled import compile_request, compiled, uncompiled
from ddpkit.parallel.recompute import check_every, checkpoint_blocks, checkpointed_classes
from ddpkit.parallel.weights import check_start, fill, materialize
from ddpkit.runtime.callbacks import registered_callbacks
from ddpkit.runtime.collectives import has_process_group
from ddpkit.runtime.session import current_world
from ddpkit.runtime.watchdog import watch

# name -> "module:descriptor". Asked in this order which one owns a model; "none" owns any.
STRATEGY_MODULES: dict[str, str] = {
    "hsdp": "ddpkit.parallel.hsdp:HSDP",  # before "fsdp", whose models it also is
    "fsdp": "ddpkit.parallel.fsdp:FSDP",
    "ddp": "ddpkit.parallel.ddp:DDP",
    "dp": "ddpkit.parallel.dp:DP",
    "none": "ddpkit.parallel.unwrapped:UNWRAPPED",
}
STRATEGIES: tuple[StrategyName, ...] = get_args(StrategyName)


def prepare_model(
    model: nn.Module,
    strategy: StrategyName = "ddp",
    *,
    sync_batchnorm: bool = False,
    comm_hook: CommHook | None = None,
    fsdp_units: Sequence[type[nn.Module]] = (),
    compile: bool | dict[str, Any] = False,
    activation_checkpointing: bool | Sequence[type[nn.Module]] = False,
    activation_checkpointing_every: int = 1,
    weights: str | os.PathLike[str] | None = None,
    **ddp_options: Any,
) -> nn.Module:
    """Move ``model`` to this rank's device and wrap it for data-parallel training.

    ``strategy`` is ``"ddp"`` (default), ``"fsdp"``, ``"hsdp"``, ``"dp"`` or ``"none"`` (see
    the module docstring for when to use which). DDP's own options pass through unchanged:
    ``bucket_cap_mb``, ``find_unused_parameters``, ``static_graph``,
    ``gradient_as_bucket_view``, ``broadcast_buffers``; ``comm_hook`` compresses DDP's
    gradient traffic (``"fp16"``, ``"bf16"``, ``"powersgd"``; see :mod:`ddpkit.parallel.commhooks`).
    ``fsdp_units`` are the module classes FSDP and HSDP shard as separate units;
    ``hsdp_shard_size`` the ranks each HSDP replica is sharded over (default: the workers per
    node); ``mixed_precision="bf16"`` gives FSDP and HSDP a mixed-precision policy: bf16
    parameters for compute, fp32 gradient reduction (:mod:`ddpkit.parallel.shardprecision`).
    ``sync_batchnorm=True`` converts BatchNorm layers to SyncBatchNorm, so statistics are
    computed over the global batch (in a world of one there is nothing to synchronize).
    ``compile=True`` (or a dict of ``torch.compile`` options) compiles the wrapped model, the
    order DDP and FSDP need (see :mod:`ddpkit.parallel.compiled`); a model compiled
    beforehand is compiled again that way.
    ``activation_checkpointing`` recomputes the activations of the block classes given
    (``True``: the ``fsdp_units``) in backward instead of keeping them, for every
    ``activation_checkpointing_every``-th block (see :mod:`ddpkit.parallel.recompute`).
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
    check_choice("strategy", strategy, STRATEGIES)
    options = _given_options(ddp_options, comm_hook, fsdp_units)
    descriptor = get_strategy(strategy)
    _check_options(descriptor, options)
    steps = _Steps(
        sync_batchnorm,
        checkpointed_classes(activation_checkpointing, fsdp_units),
        check_every(activation_checkpointing_every),
        check_start(model, weights),
        weights,
    )
    world = current_world()
    model, compile_options = compile_request(model, compile)
    # Wrapping runs collectives (DDP checks the parameters' shapes and broadcasts rank 0's
    # weights; FSDP broadcasts its state): a rank that never gets here is a hang to report.
    with watch(f"prepare_model(strategy={strategy!r})"):
        wrapped = _wrap(model, world, descriptor, options, steps)
    return compiled(wrapped, compile_options)


@dataclass(frozen=True)
class _Steps:
    """What prepare_model does around the strategy's wrap, checked before any of it runs."""

    sync_batchnorm: bool
    recomputed: tuple[type[nn.Module], ...]  # activation checkpointing's block classes
    every: int
    empty: bool  # built on the meta device
    weights: str | os.PathLike[str] | None


def _wrap(
    model: nn.Module, world: World, descriptor: Strategy, options: dict[str, Any], steps: _Steps
) -> nn.Module:
    for callback in registered_callbacks():  # before wrapping evens the ranks' weights out
        callback.on_model_built(model)
    if steps.sync_batchnorm:
        model = _convert_sync_batchnorm(model, world)
    if steps.recomputed:
        _checkpoint_activations(model, steps.recomputed, steps.every)
    if steps.empty and not (descriptor.sharded and has_process_group()):
        materialize(model, world.device)  # held whole on this rank: storage for all of it
    wrapped = descriptor.wrap(model, world, options)
    if steps.weights is not None:
        fill(descriptor.unwrap(wrapped), steps.weights, world.device)
    return wrapped


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


def _given_options(
    ddp_options: dict[str, Any], comm_hook: str | None, fsdp_units: Sequence[type[nn.Module]]
) -> dict[str, Any]:
    options = dict(ddp_options)
    if comm_hook is not None:
        check_choice("comm_hook", comm_hook, COMM_HOOKS)  # in a world of one too
        options["comm_hook"] = comm_hook
    if fsdp_units:
        options["fsdp_units"] = fsdp_units
    return options


def _check_options(descriptor: Strategy, options: dict[str, Any]) -> None:
    known = set().union(*(get_strategy(name).options for name in STRATEGY_MODULES))
    unknown = sorted(set(options) - known)
    if unknown:
        accepted = [name for name in get_strategy("ddp").options if name != "comm_hook"]
        raise ConfigError(
            f"unknown DDP option(s) {', '.join(unknown)}; accepted: {', '.join(accepted)}"
        )
    misplaced = [name for name in options if name not in descriptor.options]
    if misplaced:
        owners = [n for n in STRATEGIES if misplaced[0] in get_strategy(n).options]
        names = [name for name in misplaced if name in get_strategy(owners[0]).options]
        verb = "applies" if len(names) == 1 else "apply"
        where = " or ".join(f'"{owner}"' for owner in owners)
        raise ConfigError(
            f"{', '.join(names)} only {verb} to strategy={where}, not {descriptor.name!r}"
        )


def _checkpoint_activations(
    model: nn.Module, classes: tuple[type[nn.Module], ...], every: int
) -> None:
    count = checkpoint_blocks(model, classes, every)
    names = ", ".join(c.__name__ for c in classes)
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
