"""Your own state in checkpoints: any object with ``state_dict()``, or plain values.

``Trainer(state={...})`` and :class:`~ddpkit.train.loop.TrainLoop` checkpoint a dict of named
entries, as torchtitan's ``Stateful`` and Lightning Fabric's ``fabric.save(path, state)`` do:

- an object with ``state_dict()`` and ``load_state_dict()`` (an EMA copy of the weights, a
  model, an optimizer, a scheduler, a data-augmentation policy) is saved by its state dict and
  restored in place;
- anything else (a step counter, a best score, a tokenizer's vocab size, a list of
  strings) is saved as it is and put back into the dict on resume.

Checkpoints load with ``torch.load(weights_only=True)``, which refuses arbitrary pickled
objects, so a plain value must be built from tensors, numbers, strings, None, lists, tuples
and dicts; anything else is refused when the checkpoint is written, naming the entry, not
found unloadable after the job was preempted.

Example:
    >>> import torch
    >>> ema = torch.nn.Linear(2, 2)
    >>> state = {"ema": ema, "best_loss": 0.31}
    >>> saved = save_entries(state)
    >>> state["best_loss"] = 9.0
    >>> load_entries(state, saved)
    >>> state["best_loss"]
    0.31
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import torch
from torch import nn

from ddpkit._core.log import logger
from ddpkit.errors import CheckpointError, ConfigError
from ddpkit.parallel.strategy import unwrap_model

_PLAIN = (
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    type(None),
    torch.Tensor,
    torch.dtype,
    torch.device,
)


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
        if callable(getattr(target, "load_state_dict", None)):
            _load_into(name, target, saved[name])
        else:
            state[name] = saved[name]


def _load_into(name: str, target: Any, saved: Any) -> None:
    try:
        target.load_state_dict(saved)
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
        what = type(value).__name__
        verb = "is" if value is entry else "holds"
        raise ConfigError(
            f"state[{name!r}] {verb} a {what}, which a checkpoint cannot hold safely (it loads "
            "with torch.load(weights_only=True)): give it state_dict() and load_state_dict() "
            "methods, or keep only plain values (tensors, numbers, strings, lists, dicts)"
        )
