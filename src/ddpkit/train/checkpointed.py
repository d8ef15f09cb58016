"""What a Trainer checkpoint holds, and how it is put back: the Trainer's ``state_dict``.

One model and one optimizer are saved as ``"model"`` (the unwrapped module's state dict, no
``module.`` prefix) and ``"optimizer"``, as ddpkit always did; models given by name are
saved together under ``"model"`` with ``"<name>."`` prefixes, and their optimizers and
schedulers under ``"optimizers"`` / ``"schedulers"`` by name. The position (epoch, step),
the metrics history, the grad scaler and your own ``state`` entries
(:mod:`ddpkit.train.stateful`) go with them; callbacks may add entries.

Example:
    >>> named({"G": 1, "D": 2}, "model"), named(3, "model"), named(None, "scheduler")
    ({'G': 1, 'D': 2}, {'model': 3}, {})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ddpkit.errors import CheckpointError
from ddpkit.train.stateful import load_entries, save_entries

if TYPE_CHECKING:
    from ddpkit.env.world import World
    from ddpkit.parallel.base import Strategy
    from ddpkit.train.callbacks import Callbacks
    from ddpkit.train.precision import MixedPrecision

CHECKPOINT_FORMAT = "ddpkit.checkpoint/2"


def named(value: Any, single: str) -> dict[str, Any]:
    """A mapping as a dict; one object as ``{single: value}``; None as ``{}``."""
    if value is None:
        return {}
    return dict(value) if isinstance(value, Mapping) else {single: value}


class TrainerState:
    """The Trainer's position, models, optimizers, schedulers and user state, and their
    checkpoint form.

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(1, 1)
        >>> TrainerState(model, torch.optim.SGD(model.parameters(), lr=1), None, None).step
        0
    """

    world: World
    model: nn.Module
    strategy: Strategy
    precision: MixedPrecision
    callbacks: Callbacks

    def __init__(self, model: Any, optimizer: Any, scheduler: Any, state: Any) -> None:
        self.models: dict[str, nn.Module] = named(model, "model")
        self.optimizers: dict[str, torch.optim.Optimizer] = named(optimizer, "optimizer")
        self.schedulers: dict[str, Any] = named(scheduler, "scheduler")
        self._by_name = {
            "optimizer": isinstance(optimizer, Mapping),
            "scheduler": isinstance(scheduler, Mapping),
        }
        self.optimizer = next(iter(self.optimizers.values()))  # the first, for one-model code
        self.scheduler = next(iter(self.schedulers.values()), None)
        self.state: dict[str, Any] = state if state is not None else {}
        self.epoch = 0  # completed epochs
        self.step = 0  # optimizer steps taken (skipped ones included)
        self.skipped_steps = 0  # steps skipped for a non-finite loss
        self.history: list[dict[str, float]] = []

    def state_dict(self, weights: bool = True) -> dict[str, Any]:
        """Everything needed to resume: models (unwrapped), optimizers, schedulers, epoch,
        metrics, your ``state``. ``weights=False`` leaves out the model and optimizer (FSDP
        saves those as shards).

        Example::

            sorted(trainer.state_dict())
            # ['epoch', 'format', 'grad_scaler', 'history', 'model', 'optimizer', ...]
        """
        state = {
            "format": CHECKPOINT_FORMAT,
            "epoch": self.epoch,
            "step": self.step,
            "skipped_steps": self.skipped_steps,
            "history": list(self.history),
            "world_size": self.world.world_size,
            **self._saved("scheduler", self.schedulers, {"scheduler": None}),
            "grad_scaler": self.precision.state_dict(),
            "user_state": save_entries(self.state),
        }
        if weights:
            state["model"] = self.strategy.unwrap(self.model).state_dict()
            state.update(self._saved("optimizer", self.optimizers, {}))
        self.callbacks.call("on_save_checkpoint", self, state)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` output (for example a loaded checkpoint).

        Example::

            trainer.load_state_dict(ddpkit.checkpoint.load_checkpoint(path))
        """
        if "model" in state:
            self._load_weights(state)
        self.epoch = int(state["epoch"])
        self.step = int(state.get("step", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.history = list(state.get("history", []))
        for name, saved in self._loaded("scheduler", state).items():
            if name in self.schedulers and saved is not None:
                self.schedulers[name].load_state_dict(saved)
        self.precision.load_state_dict(state.get("grad_scaler") or {})
        load_entries(self.state, state.get("user_state") or {})
        self.callbacks.call("on_load_checkpoint", self, state)

    def _load_weights(self, state: dict[str, Any]) -> None:
        try:
            self.strategy.unwrap(self.model).load_state_dict(state["model"])
            saved = self._loaded("optimizer", state)
            for name, optimizer in self.optimizers.items():
                optimizer.load_state_dict(saved[name])
        except (KeyError, RuntimeError, ValueError, TypeError) as err:
            raise CheckpointError(
                f"checkpoint does not match this model/optimizer: {str(err).strip()[:500]}"
            ) from err

    def _saved(self, kind: str, objects: dict[str, Any], empty: dict[str, Any]) -> dict[str, Any]:
        """``{kind: state}`` for one object, ``{kind + "s": {name: state}}`` for several."""
        if self._by_name[kind]:
            return {f"{kind}s": {name: obj.state_dict() for name, obj in objects.items()}}
        if not objects:
            return empty
        return {kind: next(iter(objects.values())).state_dict()}

    def _loaded(self, kind: str, state: Mapping[str, Any]) -> dict[str, Any]:
        if self._by_name[kind]:
            return dict(state.get(f"{kind}s") or {})
        return {kind: state.get(kind)}
