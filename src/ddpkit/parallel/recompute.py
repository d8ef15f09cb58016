"""Activation checkpointing: blocks whose activations are recomputed in backward, not kept.

A deep model's memory during training is mostly the activations forward keeps for backward,
and they grow with the batch and the depth, not with the world size: FSDP shards the
parameters and optimizer state, never the activations. Checkpointing a block keeps only its
input and runs its forward again in backward: about one forward more of compute for
activations the size of one block instead of every block's (torchtitan's "full" mode; every
k-th block is its "selective by layer" mode).

``prepare_model(model, "fsdp", fsdp_units=(Block,), activation_checkpointing=True)``
checkpoints the FSDP units; ``activation_checkpointing=(Block,)`` names the classes under any
strategy; ``activation_checkpointing_every=2`` checkpoints every second one. Each block is
wrapped in torch's ``checkpoint_wrapper`` (non-reentrant ``torch.utils.checkpoint``), as
torchtitan does: it composes with DDP, FSDP2 (the wrapper becomes the FSDP unit) and
``torch.compile``, and its state-dict hooks drop the wrapper from the keys, so checkpoints
load with or without it.

Example:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    >>> checkpoint_blocks(net, (torch.nn.Linear,))
    2
    >>> list(net.state_dict())[0]
    '0.weight'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from ddpkit.errors import ConfigError

# The attribute torch's CheckpointWrapper keeps the wrapped block in.
WRAPPED = "_checkpoint_wrapped_module"


def checkpoint_blocks(model: nn.Module, classes: Sequence[type[nn.Module]], every: int = 1) -> int:
    """Wrap every ``every``-th module of ``classes`` (outermost ones, in model order) in a
    checkpoint wrapper; returns how many were wrapped.

    Example:
        >>> checkpoint_blocks(nn.Sequential(nn.Linear(1, 1), nn.ReLU()), (nn.Linear,))
        1
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    chosen = _outermost(model, tuple(classes))[::every]
    for parent, name, block in chosen:
        wrapped = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        setattr(parent, name, wrapped)
    return len(chosen)


def checkpointed_classes(
    request: bool | Sequence[type[nn.Module]], units: Sequence[type[nn.Module]]
) -> tuple[type[nn.Module], ...]:
    """The classes ``activation_checkpointing=request`` means: ``True`` takes the FSDP
    ``units``; a ConfigError says what to pass where nothing is named.

    Example:
        >>> checkpointed_classes(True, [nn.Linear])
        (<class 'torch.nn.modules.linear.Linear'>,)
    """
    classes = tuple(units) if request is True else tuple(request or ())
    bad = [c for c in classes if not (isinstance(c, type) and issubclass(c, nn.Module))]
    if bad or (request is True and not classes):
        raise ConfigError(
            "activation_checkpointing takes the block classes to recompute, e.g. "
            "activation_checkpointing=(TransformerBlock,), or True to recompute the FSDP "
            f"units given as fsdp_units; got {bad[0] if bad else request!r}"
        )
    return classes


def check_every(every: Any) -> int:
    """A positive whole number, or a ConfigError.

    Example:
        >>> check_every(2)
        2
    """
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigError(
            f"activation_checkpointing_every must be a positive whole number (1: every block, "
            f"2: every second one); got {every!r}"
        )
    return every


def unit_of(module: nn.Module) -> nn.Module:
    """The block inside a checkpoint wrapper, or ``module`` itself: what FSDP asks the class of.

    Example:
        >>> layer = nn.Linear(1, 1)
        >>> unit_of(layer) is layer
        True
    """
    inner = getattr(module, WRAPPED, None)
    return inner if isinstance(inner, nn.Module) else module


def _outermost(
    model: nn.Module, classes: tuple[type[nn.Module], ...]
) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, module) of each module of ``classes`` not inside another one."""
    found: list[tuple[nn.Module, str, nn.Module]] = []

    def visit(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            if isinstance(child, classes):
                found.append((parent, name, child))
            else:
                visit(child)

    visit(model)
    return found
