"""Several models trained together: a GAN's generator and discriminator, a teacher and student.

Each model is prepared on its own (``prepare_model``), then grouped by name; the group is one
``nn.Module`` holding them, whose strategy descriptor answers for all of them, so the Trainer,
checkpoints, the replica check and ``ddpkit verify`` treat it as they treat one model: its
``state_dict`` keys are ``"<name>.<parameter>"``, gradient sync is suppressed in every member,
uneven ranks join every member's all-reduces. The members must share a strategy; FSDP
members are not supported yet (their sharded checkpoints are one model's).

Example:
    >>> import torch
    >>> group = ModelGroup({"G": torch.nn.Linear(2, 3), "D": torch.nn.Linear(3, 1)})
    >>> from ddpkit.parallel.strategy import strategy_of, unwrap_model
    >>> strategy_of(group).name, sorted(unwrap_model(group).state_dict())[:2]
    ('none', ['D.bias', 'D.weight'])
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ddpkit.compiling.wrap import uncompiled
from ddpkit.errors import ConfigError
from ddpkit.parallel.base import Strategy
from ddpkit.parallel.strategy import strategy_of

if TYPE_CHECKING:
    from ddpkit.env.world import World


class ModelGroup(nn.ModuleDict):
    """Prepared models by name, trained as one; see the module docstring.

    Example:
        >>> import torch
        >>> list(ModelGroup({"a": torch.nn.Linear(1, 1)}))
        ['a']
    """

    def __init__(self, models: Mapping[str, nn.Module]) -> None:
        if not models:
            raise ConfigError("a group of models needs at least one model")
        super().__init__(dict(models))
        self.ddpkit_strategy = GroupStrategy(self)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError(
            "a group of models has no forward of its own: call its members, e.g. "
            "trainer.models['G'](z), in your training_step"
        )


class GroupStrategy(Strategy):
    """The members' common strategy, applied to each member.

    Example:
        >>> import torch
        >>> GroupStrategy(ModelGroup({"a": torch.nn.Linear(1, 1)})).replicas_identical
        True
    """

    def __init__(self, group: ModelGroup) -> None:
        kinds = {name: strategy_of(model) for name, model in group.items()}
        # Asked of every member, by what the strategies answer, not by their names.
        if any(kind.sharded for kind in kinds.values()):
            raise ConfigError(
                "several FSDP models in one Trainer are not supported yet; use "
                "strategy='ddp' for them, or train one sharded model per Trainer"
            )
        if len({_traits(kind) for kind in kinds.values()}) > 1:
            listed = ", ".join(f"{name}: {type(kind).__name__}" for name, kind in kinds.items())
            raise ConfigError(f"the models of a group must share a strategy; got {listed}")
        member = next(iter(kinds.values()))
        self.member = member
        self.name = member.name
        self.replicas_identical = member.replicas_identical
        self.checkpoint_kind = member.checkpoint_kind
        self.uneven_batches = member.uneven_batches

    def wrap(self, model: nn.Module, world: World) -> nn.Module:
        raise ConfigError("prepare each model with ddpkit.prepare_model, then group them")

    def owns(self, model: nn.Module) -> bool:
        return isinstance(model, ModelGroup)

    def unwrap(self, model: nn.Module) -> nn.Module:
        members = _members(uncompiled(model))
        return nn.ModuleDict({name: self.member.unwrap(m) for name, m in members})

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        stack = contextlib.ExitStack()
        for _, member in _members(model):
            stack.enter_context(self.member.no_sync(member))
        return stack

    def join(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        if self.uneven_batches != "join":
            return contextlib.nullcontext()
        # One Join over every member: nested Joins would each wait for the others' ranks.
        from torch.distributed.algorithms.join import Join

        return Join([member for _, member in _members(model)])  # type: ignore[misc]

    def full_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return {
            f"{name}.{key}": value
            for name, member in _members(model)
            for key, value in self.member.full_state(member).items()
        }


def _traits(kind: Strategy) -> tuple[object, ...]:
    """What the engine asks of a strategy: members must answer alike (their options, such as
    DDP's bucket size, may differ)."""
    return (type(kind), kind.name, kind.replicas_identical, kind.checkpoint_kind,
            kind.uneven_batches, kind.sharded)  # fmt: skip


def _members(model: nn.Module) -> list[tuple[str, nn.Module]]:
    assert isinstance(model, ModelGroup)
    return list(model.items())
