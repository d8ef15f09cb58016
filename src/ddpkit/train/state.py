"""What a training run checkpoints, and how: models, every optimizer and scheduler, your own
entries, the position, and the checkpoint format's versions in one place.

One model and one optimizer are saved as ``"model"`` (the unwrapped module's state dict) and
``"optimizer"``; models by name under ``"model"`` with ``"<name>."`` prefixes, their
optimizers and schedulers under ``"optimizers"`` / ``"schedulers"``. Your own entries
(``state={...}``) are saved as torchtitan's ``Stateful`` does: an object with ``state_dict()``
by it, restored in place; anything else as it is (loadable with ``weights_only=True``), put
back into your dict on resume.

Example:
    >>> import torch
    >>> ema = torch.nn.Linear(2, 2)
    >>> saved = save_entries({"ema": ema, "best_loss": 0.31})
    >>> state = {"ema": ema, "best_loss": 9.0}
    >>> load_entries(state, saved); state["best_loss"]
    0.31
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import torch
from torch import nn

from ddpkit._core.log import logger
from ddpkit.errors import CheckpointError, ConfigError
from ddpkit.parallel.group import ModelGroup
from ddpkit.parallel.strategy import strategy_of, unwrap_model

CHECKPOINT_FORMAT = "ddpkit.checkpoint/2"
_TORCH_VALUES = (torch.Tensor, torch.dtype, torch.device)
_PLAIN = (bool, int, float, complex, str, bytes, type(None), *_TORCH_VALUES)


class RunState:
    """A run's models, optimizers, schedulers, your entries and position (epoch, step).

    ``user_keys`` names the entries of ``user_state`` to checkpoint (None: all of them);
    plain values are read from and put back into ``user_state`` itself.

    Example:
        >>> model = torch.nn.Linear(1, 1)
        >>> run = RunState(model, torch.optim.SGD(model.parameters(), lr=1))
        >>> run.step, list(run.optimizers)
        (0, ['optimizer'])
    """

    def __init__(
        self,
        models: nn.Module | Mapping[str, nn.Module],
        optimizers: torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer],
        schedulers: Any = None,
        user_state: dict[str, Any] | None = None,
        user_keys: list[str] | None = None,
    ) -> None:
        self.models: dict[str, nn.Module] = named(models, "model")
        self.model = models if isinstance(models, nn.Module) else ModelGroup(self.models)
        self.strategy = strategy_of(self.model)  # what the loop, resume and checks ask of it
        self.optimizers: dict[str, torch.optim.Optimizer] = named(optimizers, "optimizer")
        self.schedulers: dict[str, Any] = named(schedulers, "scheduler")
        by_name = {"optimizer": optimizers, "scheduler": schedulers}
        self._by_name = {kind: isinstance(given, Mapping) for kind, given in by_name.items()}
        self.user_state: dict[str, Any] = user_state if user_state is not None else {}
        self._user_keys = user_keys
        self.epoch = 0  # completed epochs
        self.step = 0  # optimizer steps taken (skipped ones included)
        self.skipped_steps = 0  # steps skipped for a non-finite loss
        self.history: list[dict[str, float]] = []

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> RunState:
        """A hand-written loop's dict: models and optimizers found by type, the rest entries.

        Example:
            >>> RunState.from_dict({"model": torch.nn.Linear(1, 1)})
            Traceback (most recent call last):
            ...
            ddpkit.errors.ConfigError: TrainLoop's state needs the model(s) and optimizer(s) ...
        """
        models = {k: v for k, v in state.items() if isinstance(v, nn.Module)}
        optimizers = {k: v for k, v in state.items() if isinstance(v, torch.optim.Optimizer)}
        if not models or not optimizers:
            raise ConfigError(
                "TrainLoop's state needs the model(s) and optimizer(s) it checkpoints: "
                "TrainLoop({'model': model, 'optimizer': opt, ...})"
            )
        rest = [k for k in state if k not in models and k not in optimizers]
        return cls(_one_or_named(models), _one_or_named(optimizers), None, state, rest)

    def state_dict(self, weights: bool = True) -> dict[str, Any]:
        """The run in its checkpoint form (``weights=False``: without the models and
        optimizers, which FSDP saves as shards, every optimizer among them).

        Example::

            sorted(run.state_dict())   # ['epoch', 'format', 'history', 'model', ...]
        """
        state = {
            "format": CHECKPOINT_FORMAT,
            "epoch": self.epoch,
            "step": self.step,
            "skipped_steps": self.skipped_steps,
            "history": list(self.history),
            **self._saved("scheduler", self.schedulers, {"scheduler": None}),
            "user_state": save_entries(self._entries()),
        }
        if weights:
            state["model"] = self.strategy.unwrap(self.model).state_dict()
            state.update(self._saved("optimizer", self.optimizers, {}))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (an upgraded checkpoint, see :func:`upgrade`).

        Example::

            run.load_state_dict(upgrade(ddpkit.checkpoint.load_checkpoint(path), path))
        """
        if "model" in state:
            self._load_weights(state)
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        self.skipped_steps, self.history = int(state["skipped_steps"]), list(state["history"])
        for name, saved in self._loaded("scheduler", state).items():
            if name in self.schedulers and saved is not None:
                self.schedulers[name].load_state_dict(saved)
        entries = self._entries()
        load_entries(entries, state["user_state"])
        self.user_state.update(entries)

    def _entries(self) -> dict[str, Any]:
        keys = self._user_keys if self._user_keys is not None else list(self.user_state)
        return {key: self.user_state[key] for key in keys}

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


def upgrade(state: dict[str, Any], source: object) -> dict[str, Any]:
    """A loaded checkpoint in the current format; older formats are read here and only here.

    Format 1 (no ``"format"`` entry) predates steps' own metrics and per-rank random state.
    A format this ddpkit does not know is refused naming it, not guessed at.

    Example:
        >>> upgrade({"format": "ddpkit.checkpoint/9", "epoch": 1}, "e.pt")
        Traceback (most recent call last):
        ...
        ddpkit.errors.CheckpointError: e.pt is in checkpoint format 'ddpkit.checkpoint/9', ...
    """
    found = state.get("format", "ddpkit.checkpoint/1")
    if found == CHECKPOINT_FORMAT:
        return state
    if found != "ddpkit.checkpoint/1":
        raise CheckpointError(
            f"{source} is in checkpoint format {found!r}, which this ddpkit cannot read (it "
            f"reads {CHECKPOINT_FORMAT!r} and older): upgrade ddpkit, or resume elsewhere"
        )
    defaults = {
        "step": 0,
        "skipped_steps": 0,
        "history": [],
        "user_state": {},
        "ranks": None,
        "grad_scaler": {},
    }
    upgraded = {**defaults, **state, "format": CHECKPOINT_FORMAT}
    if upgraded.get("progress") is not None and "metric_names" not in upgraded["progress"]:
        upgraded["progress"] = _classifier_sums(upgraded["progress"])
    return upgraded


def _classifier_sums(progress: dict[str, Any]) -> dict[str, Any]:
    """Format 1's epoch sums ``[loss*n, n, correct, top-5 correct]`` as named sums."""
    old = progress["metric_sums"].tolist()
    shown = 1 + bool(progress["classifier"]) + bool(progress.get("top5"))
    names = ["loss", "accuracy", "top5_accuracy"][:shown]
    sums = [old[1], old[0], old[2], old[3]][: shown + 1]
    return {**progress, "metric_names": names, "metric_sums": torch.tensor(sums).double()}


def named(value: Any, single: str) -> dict[str, Any]:
    """A mapping as a dict; one object as ``{single: value}``; None as ``{}``.

    Example:
        >>> named({"G": 1, "D": 2}, "model"), named(3, "model"), named(None, "scheduler")
        ({'G': 1, 'D': 2}, {'model': 3}, {})
    """
    if value is None:
        return {}
    return dict(value) if isinstance(value, Mapping) else {single: value}


def _one_or_named(objects: dict[str, Any]) -> Any:
    return next(iter(objects.values())) if len(objects) == 1 else objects


def save_entries(state: Mapping[str, Any]) -> dict[str, Any]:
    """Each entry's state dict, or its plain value (checked to load with weights_only).

    Example:
        >>> save_entries({"step": 3, "names": ["a", "b"]})
        {'step': 3, 'names': ['a', 'b']}
        >>> save_entries({"tokenizer": object()})
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: state['tokenizer'] is a object, which a checkpoint cannot ...
    """
    saved: dict[str, Any] = {}
    for name, value in state.items():
        if isinstance(value, nn.Module):
            saved[name] = unwrap_model(value).state_dict()
        elif callable(getattr(value, "state_dict", None)):
            saved[name] = value.state_dict()
        else:
            _check_plain(name, value, value)
            saved[name] = value
    return saved


def load_entries(state: MutableMapping[str, Any], saved: Mapping[str, Any]) -> None:
    """Restore ``saved`` into ``state``: objects in place, plain values replaced.

    An entry the checkpoint does not hold keeps its value (it was added since), with a note.

    Example:
        >>> state = {"step": 0, "new": 1}
        >>> load_entries(state, {"step": 5})
        ddpkit: the checkpoint holds no state['new']: it keeps its value
        >>> state
        {'step': 5, 'new': 1}
    """
    for name, value in list(state.items()):
        if name not in saved:
            logger.info(f"the checkpoint holds no state[{name!r}]: it keeps its value")
            continue
        target = unwrap_model(value) if isinstance(value, nn.Module) else value
        if not callable(getattr(target, "load_state_dict", None)):
            state[name] = saved[name]
            continue
        try:
            target.load_state_dict(saved[name])
        except (KeyError, RuntimeError, ValueError, TypeError) as err:
            raise CheckpointError(
                f"state[{name!r}] does not match the checkpoint: {str(err).strip()[:300]}"
            ) from err


def _check_plain(name: str, value: Any, entry: Any) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_plain(name, key, entry)
            _check_plain(name, item, entry)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_plain(name, item, entry)
    elif not isinstance(value, _PLAIN):
        verb = "is" if value is entry else "holds"
        raise ConfigError(
            f"state[{name!r}] {verb} a {type(value).__name__}, which a checkpoint cannot hold "
            "safely (it loads with torch.load(weights_only=True)): give it state_dict() and "
            "load_state_dict() methods, or keep only plain values (tensors, numbers, strings, "
            "lists, dicts)"
        )
