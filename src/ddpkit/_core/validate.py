"""Argument checks shared by the public API, each raising :class:`ConfigError` with the fix.

Example:
    >>> check_choice("strategy", "ddp", ("ddp", "none"))
    >>> check_positive_int("epochs", 0)
    Traceback (most recent call last):
    ...
    ddpkit.errors.ConfigError: epochs must be a positive integer (got 0)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

from ddpkit.errors import ConfigError

SchedulerInterval = Literal["step", "epoch"]


def check_choice(name: str, value: object, choices: Sequence[str]) -> None:
    """Refuse ``value`` unless it is one of ``choices``, listing them.

    Example:
        >>> check_choice("uneven", "pad", ("pad", "drop"))
    """
    if value not in choices:
        raise ConfigError(
            f"unknown {name} {value!r}; choose one of {', '.join(repr(c) for c in choices)}"
        )


def check_positive_int(name: str, value: object) -> None:
    """Refuse anything but an int >= 1 (bools too, though Python counts them as ints).

    Example:
        >>> check_positive_int("batch_size", 32)
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer (got {value!r})")


def check_training_options(
    accumulate: int, clip: float | None, check_replicas_every: int | None, interval: str
) -> None:
    """The Trainer's loop options, each refused with its name and value when it cannot work.

    Example:
        >>> check_training_options(1, 0.0, None, "step")
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: clip_grad_norm must be > 0 (got 0.0)
    """
    check_positive_int("accumulate", accumulate)
    if clip is not None and not clip > 0:
        raise ConfigError(f"clip_grad_norm must be > 0 (got {clip!r})")
    if check_replicas_every is not None:
        check_positive_int("check_replicas_every", check_replicas_every)
    check_choice("scheduler_interval", interval, get_args(SchedulerInterval))
