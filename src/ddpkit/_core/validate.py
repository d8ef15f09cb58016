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

from ddpkit.errors import ConfigError


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


def check_seconds(name: str, value: object) -> float:
    """``value`` as seconds, refusing anything but a number >= 0 (NaN and bools too).

    Example:
        >>> check_seconds("hang_timeout", 30)
        30.0
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigError(f"{name} must be a number of seconds >= 0 (got {value!r})")
    return float(value)
