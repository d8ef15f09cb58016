"""What the Trainer's parts may read of it: a typed view, so no part takes ``trainer: Any``.

The checkpointer, the start-up line and the step monitor work with any object that has these
attributes (the :class:`~ddpkit.train.trainer.Trainer` is one; tests pass small stand-ins).

Example:
    >>> from ddpkit.train.trainer import Trainer
    >>> sorted(TrainingRun.__annotations__)[:3]
    ['accumulate', 'epoch', 'model']
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ddpkit.env.world import World
    from ddpkit.train.precision import MixedPrecision


class TrainingRun(Protocol):
    """A training run as its parts see it: model, optimizer, position, precision, state."""

    world: World
    model: nn.Module
    optimizer: torch.optim.Optimizer
    optimizers: dict[str, torch.optim.Optimizer]
    accumulate: int
    precision: MixedPrecision
    epoch: int  # completed epochs
    step: int  # optimizer steps taken

    def state_dict(self, weights: bool = True) -> dict[str, Any]:
        """Everything needed to resume (``weights=False``: without model and optimizer)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` output."""
        ...
