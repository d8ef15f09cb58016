"""The strategy descriptor: what every part of ddpkit asks of a parallelized model.

A strategy is chosen by name in ``prepare_model`` and answers, for the model it wrapped, what
the Trainer, resume, the replica check, uneven data and ``ddpkit verify`` need to know:
its name; how to keep gradients local for accumulation; whether every rank holds an
identical replica; what to do when ranks have different numbers of batches; whether
checkpoints are whole files or shards; how to get the user's module and its whole state.
These questions used to be ``isinstance`` checks spread over eight modules; now each is asked
of one object, and a new strategy is one new module.

Example:
    >>> import torch
    >>> from ddpkit.parallel.strategy import strategy_of
    >>> strategy_of(torch.nn.Linear(2, 2)).name
    'none'
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import nn

from ddpkit.parallel.compiled import uncompiled

if TYPE_CHECKING:
    from ddpkit.env.world import World

StrategyName = Literal["ddp", "fsdp", "hsdp", "dp", "none"]
CheckpointKind = Literal["whole", "sharded"]
# What ranks with different numbers of batches need: torch's Join (DDP), a refusal (FSDP's
# all-gathers cannot be joined), or nothing (no collective runs inside the loop).
UnevenBatches = Literal["join", "refuse", "free"]


class Strategy(ABC):
    """One way of making a model data-parallel; subclasses set the class attributes.

    Example:
        >>> from ddpkit.parallel.unwrapped import UNWRAPPED
        >>> UNWRAPPED.replicas_identical, UNWRAPPED.checkpoint_kind
        (True, 'whole')
    """

    # Class attributes of each strategy; a descriptor made per model (a group of models)
    # may set them on the instance.
    name: StrategyName
    options: tuple[str, ...] = ()  # keyword options prepare_model passes on
    replicas_identical: bool = True  # False: ranks hold different shards
    checkpoint_kind: CheckpointKind = "whole"
    uneven_batches: UnevenBatches = "free"

    @abstractmethod
    def wrap(self, model: nn.Module, world: World, options: dict[str, Any]) -> nn.Module:
        """Move ``model`` to the world's device and wrap it; ``options`` are checked already."""

    @abstractmethod
    def owns(self, model: nn.Module) -> bool:
        """Whether ``model`` is wrapped by this strategy."""

    @property
    def compute_precision(self) -> str | None:
        """The precision a sharding policy computes in (FSDP's ``mixed_precision``), or None
        when the model computes in its parameters' dtype."""
        return None

    @property
    def layout(self) -> str:
        """How the ranks are arranged, for the start-up line ("" when there is no more to
        say than the name; HSDP: "2 replicas x 2 shards")."""
        return ""

    @property
    def sharded(self) -> bool:
        """True when parameters and gradients are sharded over the ranks."""
        return self.checkpoint_kind == "sharded"

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's own module inside the wrapper (its state_dict has no prefix), looking
        through ``torch.compile``'s wrapper too."""
        return uncompiled(model)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """A context in which ``backward()`` keeps gradients local (accumulation)."""
        return contextlib.nullcontext()

    def join(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Around an epoch whose ranks hold different numbers of batches."""
        return contextlib.nullcontext()

    def full_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's tensors on CPU (a collective where the state is sharded)."""
        state = self.unwrap(model).state_dict()
        return {name: t.detach().cpu().clone() for name, t in state.items() if torch.is_tensor(t)}


class ModuleWrapperStrategy(Strategy):
    """A strategy whose wrapper keeps the user's module as ``.module`` (DDP, DataParallel).

    Example:
        >>> from ddpkit.parallel.dp import DP
        >>> DP.unwrap(torch.nn.DataParallel(torch.nn.Linear(1, 1))).in_features
        1
    """

    wrapper: ClassVar[type[nn.Module]]

    def owns(self, model: nn.Module) -> bool:
        return isinstance(model, self.wrapper)

    def unwrap(self, model: nn.Module) -> nn.Module:
        model = uncompiled(model)
        inner = model.module if self.owns(model) else model
        assert isinstance(inner, nn.Module)
        return uncompiled(inner)
