"""Reading launchers' environment variables, with errors that name the variable.

Example:
    >>> int_var({"WORLD_SIZE": "4"}, "WORLD_SIZE")
    4
"""

from __future__ import annotations

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
