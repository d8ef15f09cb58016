"""Which torch is installed, for the few places ddpkit falls back on an older release.

ddpkit supports torch 2.7 and newer (``pyproject.toml``); ``make test-oldest`` runs the
oldest of them. Each fallback names the release that made it unnecessary, so it can go
when the floor rises past it.

Example:
    >>> torch_at_least("2.7")
    True
"""

from __future__ import annotations

import functools
import sys
from importlib import metadata

OLDEST_SUPPORTED = "2.7"


@functools.cache
def torch_release() -> tuple[int, int]:
    """The installed torch's (major, minor), read without importing torch.

    Example:
        >>> torch_release() >= (2, 7)
        True
    """
    try:
        text = metadata.version("torch")
    except metadata.PackageNotFoundError:  # a source build without package metadata
        # _core imports no torch (a contract); a caller about to use it has imported it
        text = getattr(sys.modules.get("torch"), "__version__", OLDEST_SUPPORTED)
    major, minor = text.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def torch_at_least(release: str) -> bool:
    """True when the installed torch is ``release`` ("2.10") or newer.

    Example:
        >>> torch_at_least("99.0")
        False
    """
    major, minor = (int(part) for part in release.split("."))
    return torch_release() >= (major, minor)


def torch_text() -> str:
    """The installed torch as users write it, e.g. "2.7".

    Example:
        >>> torch_text().count(".") == 1
        True
    """
    return "{}.{}".format(*torch_release())
