"""Every private internal of torch, torchft and CPython that ddpkit touches, in one place.

ddpkit composes torch's public parts; where it must reach inside (inductor's header folder,
torch's function-worker result queue, torchft's quorum client, torch's streaming loader,
...), it does so here and nowhere else, one module per thing it reaches into. Each internal
is an :class:`Internal`: where it lives, the releases it was checked on (those ``make test``
runs: torch 2.7 and 2.13, torchft 0.2), and what ddpkit does without it. On a release it
was not checked on, the first use says so once; where the internal is gone, ddpkit takes the
fallback the :class:`Internal` names and says so once, or raises a ConfigError where there
is none. Never silence.

Example:
    >>> HEADERS = Internal("torch._inductor.codecache._HEADER_DIR", "torch",
    ...                    "precompiled headers are rebuilt on each new node")
    >>> HEADERS.package_version() is not None
    True
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from importlib import metadata

from ddpkit._core.log import logger

# The releases each package's internals were checked on, oldest and newest: make test runs
# the unit tier and the oldest_torch tests under torch 2.7, everything under 2.13.
CHECKED = {"torch": ((2, 7), (2, 13)), "torchft": ((0, 2), (0, 2)), "python": ((3, 10), (3, 13))}


@dataclass(frozen=True)
class Internal:
    """One private internal: ``where`` it lives, its ``package`` ("torch", "torchft" or
    "python"), and what ddpkit does ``without`` it.

    Example:
        >>> Internal("atexit._run_exitfuncs", "python", "exit handlers are not run").checked()
        True
    """

    where: str
    package: str
    without: str

    def package_version(self) -> tuple[int, int] | None:
        """The installed release of the package, (major, minor); None where not installed."""
        return _release(self.package)

    def checked(self) -> bool:
        """Whether the installed release is one this internal was checked on."""
        found = self.package_version()
        oldest, newest = CHECKED[self.package]
        return found is not None and oldest <= found <= newest

    def used(self) -> None:
        """Before a use: on a release it was not checked on, say so (once a process)."""
        if not self.checked():
            _say_once(self, "unchecked", self._unchecked())

    def gone(self) -> None:
        """Where the internal is missing: say what ddpkit does instead (once a process)."""
        _say_once(self, "gone", f"{self.where} is not in {self._installed()}: {self.without}")

    def _unchecked(self) -> str:
        (a, b), (c, d) = CHECKED[self.package]
        return (
            f"ddpkit uses {self.where}, checked on {self.package} {a}.{b} to {c}.{d}, and "
            f"this is {self._installed()}; if it changed there, {self.without}"
        )

    def _installed(self) -> str:
        found = self.package_version()
        return f"{self.package} {found[0]}.{found[1]}" if found else f"no {self.package}"


_said: set[tuple[str, str]] = set()


def _say_once(internal: Internal, kind: str, text: str) -> None:
    if (internal.where, kind) not in _said:
        _said.add((internal.where, kind))
        logger.warning(text)


@functools.cache
def _release(package: str) -> tuple[int, int] | None:
    if package == "python":
        return sys.version_info[0], sys.version_info[1]
    try:
        text = metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
    major, minor = [*text.split("."), "0"][:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
