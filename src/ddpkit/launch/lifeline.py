"""A worker's lifeline to its launcher: when the launcher dies, the worker is told to stop.

torch's launcher starts each worker in a session of its own, so a launcher that is killed
outright (``kill -9``, the OOM killer) cannot stop them, and they would train on as orphans.
Each worker asks Linux to send it SIGTERM when its launcher dies (``PR_SET_PDEATHSIG``): a
worker inside ``Trainer.fit`` then checkpoints at the next step and exits, any other worker
ends at once. Script workers do this in :mod:`ddpkit.launch.worker` before the script starts;
``ddpkit.spawn``'s function workers through :class:`Tied`. Those are forked by the forkserver
(:mod:`ddpkit.launch.warm.forkserver`), not by the launcher, so they watch the launcher's pidfd.

Example:
    >>> die_with_launcher(environ={})  # not started by a ddpkit launcher: nothing to tie to
    False
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ddpkit._core.protocol import LAUNCHER_PID_ENV, STDIN_LIFELINE_ENV
from ddpkit.launch.warm.forkserver import (
    fresh_process_state,
    fresh_signal_state,
    ignored_stop_signals,
    restore_launch_environment,
)

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
    if os.getppid() == int(launcher):
        return _tie_to_parent(int(launcher), sig)
    return _watch(int(launcher), sig)


def _tie_to_parent(launcher: int, sig: signal.Signals) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != launcher:  # it died before the tie was made
        os.kill(os.getpid(), sig)
    return True


def _watch(launcher: int, sig: signal.Signals) -> bool:
    """A worker forked by the forkserver: its parent is the server, which outlives the
    launcher while any worker holds the server's alive-pipe, so the kernel's parent-death
    signal would never come. A thread waits on the launcher's pidfd instead."""
    try:
        pidfd = os.pidfd_open(launcher)
    except ProcessLookupError:  # it died before the tie was made
        os.kill(os.getpid(), sig)
        return True
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3)
        return False

    def signal_when_gone() -> None:
        select.select([pidfd], [], [])
        os.kill(os.getpid(), sig)

    threading.Thread(target=signal_when_gone, name="ddpkit-lifeline", daemon=True).start()
    return True


class Tied:
    """A function to run in a worker of ``ddpkit.spawn``, tied to its launcher first.

    It carries the launch's environment (taken where it is made, inside the launch), which a
    worker forked from the forkserver would otherwise not see. A class rather than
    ``functools.partial``: torch's launcher names the entrypoint by its ``__name__``, and the
    worker receives it pickled.

    Example:
        >>> Tied(max).__name__   # called in a worker: Tied(max)(1, 2) is 2 there
        'max'
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.launch_env = dict(os.environ)
        # where the launcher ignores Ctrl-C (a background job) or SIGHUP (nohup), a fresh
        # worker would too
        on_main = threading.current_thread() is threading.main_thread()
        self.ignored = ignored_stop_signals() if on_main else frozenset()
        self.__name__ = getattr(fn, "__name__", "worker")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)

    def __call__(self, *args: Any) -> Any:
        fresh_signal_state(self.ignored)
        restore_launch_environment(self.launch_env)
        fresh_process_state()  # after the launch's environment: its OMP_NUM_THREADS
        die_with_launcher()
        return self.fn(*args)


def stop_at_end_of_input(environ: Mapping[str, str] | None = None) -> bool:
    """Under ``ddpkit run --hosts`` (``DDPKIT_STDIN_LIFELINE=1``), stop this launcher with
    SIGTERM when its standard input ends: the ssh connection that started it is gone (the
    launching side stopped, was killed, or the network was lost), so its workers stop and
    none trains on alone. Whether the watch was started.

    Example:
        >>> stop_at_end_of_input(environ={})  # not started by ddpkit run --hosts
        False
    """
    if (os.environ if environ is None else environ).get(STDIN_LIFELINE_ENV) != "1":
        return False

    def watch() -> None:
        with contextlib.suppress(OSError, ValueError):
            while os.read(0, 65536):
                pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="ddpkit-stdin-lifeline", daemon=True).start()
    return True
