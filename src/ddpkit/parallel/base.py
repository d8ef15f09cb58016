"""The strategy descriptor: what every part of ddpkit asks of a parallelized model.

A strategy is chosen in ``prepare_model``, by name (``"fsdp"``) or as an object holding its
options (``FSDPStrategy(mixed_precision="bf16")``), and answers, for the model it wrapped, what
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
import dataclasses
import functools
import importlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import torch
from torch import nn

from ddpkit.compiling.wrap import uncompiled
from ddpkit.errors import ConfigError
from ddpkit.parallel.options import check_given

if TYPE_CHECKING:
    from ddpkit.env.world import World

StrategyName = Literal["ddp", "fsdp", "hsdp", "dp", "none"]
StrategyClass = TypeVar("StrategyClass", bound=type)
# name -> "module:descriptor". Asked in this order which one owns a model; "none" owns any.
STRATEGY_MODULES: dict[str, str] = {
    "hsdp": "ddpkit.parallel.hsdp:HSDP",  # before "fsdp", whose models it also is
    "fsdp": "ddpkit.parallel.fsdp:FSDP",
    "ddp": "ddpkit.parallel.ddp:DDP",
    "dp": "ddpkit.parallel.dp:DP",
    "none": "ddpkit.parallel.unwrapped:UNWRAPPED",
}
CheckpointKind = Literal["whole", "sharded"]
# What ranks with different numbers of batches need: torch's Join (DDP), a refusal (FSDP's
# all-gathers cannot be joined), or nothing (no collective runs inside the loop).
UnevenBatches = Literal["join", "refuse", "free"]


class Strategy(ABC):
    """One way of making a model data-parallel; subclasses set the class attributes, and
    hold their options as dataclass fields (shown by ``repr`` where they differ from the
    defaults).

    Example:
        >>> from ddpkit.parallel.unwrapped import UNWRAPPED
        >>> UNWRAPPED.replicas_identical, UNWRAPPED.checkpoint_kind
        (True, 'whole')
    """

    # Class attributes of each strategy; a descriptor made per model (a group of models)
    # may set them on the instance.
    name: StrategyName
    units: tuple[type[nn.Module], ...] = ()  # the block classes sharded one at a time (FSDP)
    replicas_identical: bool = True  # False: ranks hold different shards
    checkpoint_kind: CheckpointKind = "whole"
    uneven_batches: UnevenBatches = "free"

    @abstractmethod
    def wrap(self, model: nn.Module, world: World) -> nn.Module:
        """Move ``model`` to the world's device and wrap it, as this strategy's options say."""

    @abstractmethod
    def owns(self, model: nn.Module) -> bool:
        """Whether ``model`` is wrapped by this strategy."""

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """The strategy's options, by name (none for a strategy without any).

        Example:
            >>> from ddpkit.parallel.unwrapped import Unwrapped
            >>> Unwrapped.fields()
            ()
        """
        if not dataclasses.is_dataclass(cls):
            return ()
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)

    def __repr__(self) -> str:
        if not dataclasses.is_dataclass(self):
            return f"{type(self).__name__}()"
        given = [
            f"{f.name}={option_text(getattr(self, f.name))}"
            for f in dataclasses.fields(self)
            if f.repr and getattr(self, f.name) != f.default
        ]
        return f"{type(self).__name__}({', '.join(given)})"

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


def option_text(value: Any) -> str:
    """An option's value as a call spells it: classes by name, anything else by its repr.

    Example:
        >>> option_text((torch.nn.Linear,)), option_text("bf16")
        ('(Linear,)', "'bf16'")
    """
    if isinstance(value, tuple | list) and value and all(isinstance(v, type) for v in value):
        names = ", ".join(v.__name__ for v in value)
        return f"[{names}]" if isinstance(value, list) else f"({names}{',' * (len(value) == 1)})"
    return repr(value)


def checked_options(cls: StrategyClass) -> StrategyClass:
    """Class decorator, above ``@dataclass``: an option the strategy lacks is a ConfigError
    that lists its options (and names the strategy that has it), not a TypeError; a value of
    the wrong type or out of its range is one too (:mod:`ddpkit.parallel.options`).

    Example::

        FSDPStrategy(comm_hook="bf16")   # ConfigError: FSDPStrategy has no option
        # 'comm_hook' (DDPStrategy has); its options: units, mixed_precision, ...
    """
    init = vars(cls)["__init__"]  # the one @dataclass wrote

    @functools.wraps(init)
    def checked_init(self: Any, *args: Any, **options: Any) -> None:
        own = [f.name for f in dataclasses.fields(cls) if f.init]
        if args:
            raise ConfigError(
                f"{cls.__name__} takes its options by name, e.g. {cls.__name__}({own[0]}=...); "
                f"got {args[0]!r} by position"
            )
        unknown = [name for name in options if name not in own]
        if unknown:
            raise ConfigError(
                f"{cls.__name__} has no option {unknown[0]!r}{_owners(unknown[0])}; its "
                f"options: {', '.join(own) or 'none'}"
            )
        check_given(cls, options)  # each value's type and range, before any is used
        init(self, **options)

    cls.__init__ = checked_init  # type: ignore[misc]
    return cls


def _owners(option: str) -> str:
    """ " (DDPStrategy has)": the strategies that have ``option``, to say where it belongs."""
    classes = {type(getattr(importlib.import_module(m), a)) for m, _, a in
               (path.partition(":") for path in STRATEGY_MODULES.values())}  # fmt: skip
    owners = sorted(c.__name__ for c in classes if option in c.fields())
    if not owners:
        return ""
    return f" ({' and '.join(owners)} {'has' if len(owners) == 1 else 'have'})"


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
