"""Reading environment variables, with errors that name the variable.

Example:
    >>> int_var({"WORLD_SIZE": "4"}, "WORLD_SIZE")
    4
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ddpkit.errors import ConfigError


def int_var(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    """``env[name]`` as an int, ``default`` when unset; a ConfigError naming it otherwise.

    Example:
        >>> int_var({}, "LOCAL_RANK", default=0)
        0
    """
    raw = env.get(name)
    if raw is None:
        if default is None:
            raise ConfigError(f"environment variable {name} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def positive_int_var(name: str, environ: Mapping[str, str] | None = None) -> int | None:
    """A positive integer setting from the environment, or None when unset or empty.

    Example:
        >>> positive_int_var("MAX_STEPS", {"MAX_STEPS": "20"})
        20
        >>> positive_int_var("MAX_STEPS", {"MAX_STEPS": "0"})
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: MAX_STEPS='0' must be a positive integer
    """
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{name}={raw!r} must be a positive integer")
    return int(raw)


def seconds_var(name: str, environ: Mapping[str, str] | None = None) -> float | None:
    """A duration in seconds (>= 0) from the environment, or None when unset or empty.

    Example:
        >>> seconds_var("WAIT_S", {"WAIT_S": "30"})
        30.0
        >>> seconds_var("WAIT_S", {"WAIT_S": "soon"})
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: WAIT_S='soon' must be a number of seconds >= 0
    """
    raw = (os.environ if environ is None else environ).get(name, "")
    if raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        raise ConfigError(f"{name}={raw!r} must be a number of seconds >= 0")
    return value
