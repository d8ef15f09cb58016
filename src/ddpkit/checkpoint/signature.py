"""Which model a checkpoint is of: the names, dtypes and shapes of its tensors.

Each checkpoint records :func:`model_signature`; on resume :func:`check_same_model` refuses
one of another model by name (another job sharing the folder), before any weight is loaded.

Example:
    >>> model_signature(nn.Linear(2, 1))
    {'weight': 'float32[1, 2]', 'bias': 'float32[1]'}
"""

from __future__ import annotations

import posixpath
from typing import Any

from torch import nn

from ddpkit.errors import CheckpointError

_SHOWN = 3  # differences named when a checkpoint of another model is refused


def model_signature(model: nn.Module) -> dict[str, str]:
    """``{name: "dtype[shape]"}`` for every tensor of the model's state (pass the user's module,
    not its DDP wrapper, whose names carry a ``module.`` prefix).

    FSDP's sharded parameters report their whole shape, so every rank signs alike.

    Example:
        >>> model_signature(nn.Linear(3, 2))
        {'weight': 'float32[2, 3]', 'bias': 'float32[2]'}
    """
    return {
        name: f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
        for name, value in model.state_dict().items()
        if hasattr(value, "shape")
    }


def check_same_model(recorded: Any, model: nn.Module, where: str) -> None:
    """Refuse a checkpoint whose recorded signature is not this model's.

    A checkpoint without a signature (written before ddpkit recorded one) is let through:
    loading its weights then checks names and shapes.

    Example:
        >>> check_same_model({"weight": "float32[9]"}, nn.Linear(1, 1), "runs/e.pt")
        Traceback (most recent call last):
        ...
        ddpkit.errors.CheckpointError: runs/e.pt is a checkpoint of a different model ...
    """
    if not isinstance(recorded, dict):
        return
    differences = describe_differences(recorded, model_signature(model))
    if differences:
        more = f"; {len(differences) - _SHOWN} more differ" if len(differences) > _SHOWN else ""
        raise CheckpointError(
            f"{where} is a checkpoint of a different model ({'; '.join(differences[:_SHOWN])}"
            f"{more}). Another job may share this checkpoint_dir: give each model its own "
            f"folder, or move {posixpath.dirname(where)}'s checkpoints away to start from scratch"
        )


def describe_differences(saved: dict[str, str], current: dict[str, str]) -> list[str]:
    """One line per tensor that is missing, extra, or shaped differently.

    Example:
        >>> describe_differences({"w": "float32[2]"}, {"w": "float32[3]", "b": "float32[1]"})
        ['w is float32[2] there, float32[3] here', 'b is only in this model']
    """
    lines = [
        f"{name} is {saved[name]} there, {current[name]} here"
        for name in saved
        if name in current and saved[name] != current[name]
    ]
    lines += [f"{name} is only in the checkpoint" for name in saved if name not in current]
    lines += [f"{name} is only in this model" for name in current if name not in saved]
    return lines
