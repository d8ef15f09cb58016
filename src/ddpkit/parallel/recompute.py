"""Activation checkpointing: blocks whose activations are recomputed in backward, not kept.

A deep model's memory during training is mostly the activations forward keeps for backward,
and they grow with the batch and the depth, not with the world size: FSDP shards the
parameters and optimizer state, never the activations. Checkpointing a block keeps only its
input and runs its forward again in backward: about one forward more of compute for
activations the size of one block instead of every block's (torchtitan's "full" mode; every
k-th block is its "selective by layer" mode).

``prepare_model(model, FSDPStrategy(units=(Block,)), activation_checkpointing=True)``
checkpoints the FSDP units; ``activation_checkpointing=(Block,)`` names the classes under any
strategy; ``activation_checkpointing=ActivationCheckpointing(blocks=(Block,), every=2)`` checkpoints
every second one. Each block is
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
from dataclasses import dataclass

from torch import nn

from ddpkit._compat.checkpointing import recompute_wrapper
from ddpkit._core.renamed import positional_keywords
from ddpkit.errors import ConfigError
from ddpkit.parallel.base import checked_options, option_text

# The attribute torch's CheckpointWrapper keeps the wrapped block in.
WRAPPED = "_checkpoint_wrapped_module"


def checkpoint_blocks(model: nn.Module, classes: Sequence[type[nn.Module]], every: int = 1) -> int:
    """Wrap every ``every``-th module of ``classes`` (outermost ones, in model order) in a
    checkpoint wrapper; returns how many were wrapped.

    Example:
        >>> checkpoint_blocks(nn.Sequential(nn.Linear(1, 1), nn.ReLU()), (nn.Linear,))
        1
    """
    chosen = _outermost(model, tuple(classes))[::every]
    for parent, name, block in chosen:
        setattr(parent, name, recompute_wrapper(block))
    return len(chosen)


@positional_keywords(("blocks", "every"), removed_in="0.3")
@checked_options
@dataclass(frozen=True, repr=False, kw_only=True)
class ActivationCheckpointing:
    """Which blocks recompute their activations in backward instead of keeping them.

    ``blocks``: the module classes (empty: the FSDP or HSDP strategy's ``units``); ``every``:
    every k-th of them (1: each one; 2: every second, torchtitan's selective-by-layer).
    ``prepare_model(activation_checkpointing=...)`` also takes ``True`` (the units, every
    one) and a tuple of classes (those, every one), as a strategy's name stands for its
    object with the defaults. Options are given by name, as a strategy's are, and checked
    alike (a ConfigError naming the option).

    Example:
        >>> ActivationCheckpointing(blocks=(nn.Linear,), every=2)
        ActivationCheckpointing(blocks=(Linear,), every=2)
    """

    blocks: tuple[type[nn.Module], ...] | type[nn.Module] = ()
    every: int = 1

    def __post_init__(self) -> None:
        blocks = (self.blocks,) if isinstance(self.blocks, type | str) else tuple(self.blocks)
        bad = [c for c in blocks if not (isinstance(c, type) and issubclass(c, nn.Module))]
        if bad:
            raise ConfigError(
                "activation_checkpointing takes the block classes to recompute, e.g. "
                "activation_checkpointing=(TransformerBlock,), or True to recompute the "
                f"strategy's FSDP units; got {bad[0]!r}"
            )
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ConfigError(
                "ActivationCheckpointing(every=) must be a positive whole number (1: every "
                f"block, 2: every second one); got {self.every!r}"
            )
        object.__setattr__(self, "blocks", blocks)

    def __repr__(self) -> str:
        return f"ActivationCheckpointing(blocks={option_text(self.blocks)}, every={self.every})"

    def classes(self) -> tuple[type[nn.Module], ...]:
        """The block classes, as a tuple (one class may be given alone).

        Example:
            >>> ActivationCheckpointing(blocks=nn.Linear).classes()
            (<class 'torch.nn.modules.linear.Linear'>,)
        """
        return self.blocks if isinstance(self.blocks, tuple) else (self.blocks,)


def checkpointing_request(
    request: bool | Sequence[type[nn.Module]] | ActivationCheckpointing,
    units: Sequence[type[nn.Module]],
) -> ActivationCheckpointing | None:
    """What ``activation_checkpointing=request`` means, its blocks named (``True`` and empty
    blocks take the strategy's ``units``); None for none, a ConfigError where none is named.

    Example:
        >>> checkpointing_request(True, [nn.Linear]).blocks
        (<class 'torch.nn.modules.linear.Linear'>,)
    """
    if request is False or request is None:
        return None
    asked = request if isinstance(request, ActivationCheckpointing) else None
    if asked is None:
        blocks = () if request is True else tuple(request)  # type: ignore[arg-type]
        asked = ActivationCheckpointing(blocks=blocks)
    if asked.blocks:
        return asked
    if not units:
        raise ConfigError(
            "activation_checkpointing=True recomputes the FSDP units, and this strategy has "
            "none: name the block classes, e.g. activation_checkpointing=(TransformerBlock,), "
            "or give them to the strategy, e.g. FSDPStrategy(units=(TransformerBlock,))"
        )
    return ActivationCheckpointing(blocks=tuple(units), every=asked.every)


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
