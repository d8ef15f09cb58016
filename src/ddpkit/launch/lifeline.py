"""A worker's lifeline to its launcher: when the launcher dies, the worker is told to stop.

torch's launcher starts each worker in a session of its own, so a launcher that is killed
outright (``kill -9``, the OOM killer) cannot stop them, and they would train on as orphans.
Each worker asks Linux to send it SIGTERM when its launcher dies (``PR_SET_PDEATHSIG``): a
worker inside ``Trainer.fit`` then checkpoints at the next step and exits, any other worker
ends at once. Script workers do this in :mod:`ddpkit.launch.worker` before the script starts;
``ddpkit.spawn``'s function workers through :class:`Tied`.

Example:
    >>> die_with_launcher(environ={})  # not started by a ddpkit launcher: nothing to tie to
    False
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any

from ddpkit._core.protocol import LAUNCHER_PID_ENV

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_launcher(
    sig: signal.Signals = signal.SIGTERM, environ: Mapping[str, str] | None = None
) -> bool:
    """Have Linux send ``sig`` to this process when the launcher that started it ends.

    Returns whether the tie is in place (Linux, started by a ddpkit launcher). If the
    launcher is already gone, the signal is sent at once.

    Example::

        die_with_launcher(environ={LAUNCHER_PID_ENV: str(os.getppid())})   # True
    """
    launcher = (os.environ if environ is None else environ).get(LAUNCHER_PID_ENV)
    if launcher is None or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != int(launcher):  # it died before the tie was made
        os.kill(os.getpid(), sig)
    return True


class Tied:
    """A function to run in a worker of ``ddpkit.spawn``, tied to its launcher first.

    A class rather than ``functools.partial``: torch's launcher names the entrypoint by its
    ``__name__``, and the worker receives it pickled.

    Example:
        >>> Tied(max)(1, 2)
        2
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "worker")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)

    def __call__(self, *args: Any) -> Any:
        die_with_launcher()
        return self.fn(*args)
