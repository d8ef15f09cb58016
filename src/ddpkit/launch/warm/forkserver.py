"""``ddpkit.spawn``'s workers forked from a warm server: torch imported once per session.

A worker started with the spawn method is a fresh interpreter that imports torch (2-3 s on
a CPU) and, at its first optimizer, torch._dynamo (about 2 s more) before its first step.
With Python's forkserver method one server process imports them once, and every worker is
a fork of it, so a second ``ddpkit.spawn`` in the same session (a notebook, a test suite, a
sweep) starts its workers in a fraction of a second. The server never touches CUDA, so its
children may (torch's advice for CUDA is spawn or forkserver; Python 3.14 made forkserver the
default on Linux).

A forked worker inherits the server's environment, frozen when the server started, not the
caller's at this launch; :func:`restore_launch_environment` puts the launch's environment
back, keeping what torch's launcher set for this rank.

Example:
    >>> warm_start_method() in ("forkserver", "spawn")
    True
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from multiprocessing import forkserver, resource_tracker

from ddpkit._core.log import logger
from ddpkit._core.protocol import FORWARDED_SIGNALS, WARM_SERVER_ENV

# Imported by the server once, inherited by every worker it forks: torch with dynamo (which
# the first optimizer step imports), ddpkit's training API and the workers' first module.
# This module comes first (it pauses the collector for the rest), serverready last.
PRELOADED = (
    *("ddpkit.launch.warm.forkserver", "torch._dynamo", "ddpkit", "ddpkit.launch.worker"),
    "ddpkit.launch.warm.serverready",
)

# Set by torch's agent for each rank whatever the caller's environment holds (its
# ``worker_env`` and the error file), so a value equal to the server's is still torch's.
_PER_RANK = frozenset(
    {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE"}
    | {"LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    | {"TORCH_NCCL_ASYNC_ERROR_HANDLING"}
)
_PER_RANK_PREFIX = "TORCHELASTIC_"

# In a worker forked by the server, this module was imported in the server: this is the
# environment every fork starts from. In a spawned worker it is the worker's first one.
_STARTING_ENV = dict(os.environ)


def warm_start_method() -> str:
    """ "forkserver" (preloading torch in the server) where the platform has it, else "spawn".
    "spawn" too, said once, where the server's socket cannot be made: its path, under the
    temporary directory, would pass AF_UNIX's limit (a long ``TMPDIR``).

    The preload list takes effect when the server starts, at the first forkserver launch
    of this process; a server someone else started earlier keeps its own (slower, correct).

    Example:
        >>> warm_start_method() in ("forkserver", "spawn")
        True
    """
    if "forkserver" not in multiprocessing.get_all_start_methods() or not _socket_fits():
        return "spawn"
    multiprocessing.set_forkserver_preload(list(PRELOADED))
    return "forkserver"


# AF_UNIX's sun_path holds 108 bytes on Linux, its NUL included; Python 3.11's server listens
# at <temporary folder>/listener-XXXXXXXX, and fails with "AF_UNIX path too long" past it.
_SOCKET_PATH_MOST = 107
_LISTENER_NAME = len("/listener-XXXXXXXX")
_said_too_long: list[str] = []


def _socket_fits() -> bool:
    folder = multiprocessing.util.get_temp_dir()  # the server's (made here, as it would be)
    if len(os.fsencode(folder)) + _LISTENER_NAME <= _SOCKET_PATH_MOST:
        return True
    if not _said_too_long:
        _said_too_long.append(folder)
        logger.warning(
            f"warm workers start by spawn here, not forked from a server: the server's socket "
            f"would be under {folder} ({len(os.fsencode(folder))} bytes), past AF_UNIX's "
            f"{_SOCKET_PATH_MOST}-byte limit; set TMPDIR to a shorter folder to fork them"
        )
    return False


def start_warm_server(server_env: Mapping[str, str]) -> str:
    """Start the server now, so that it imports what it preloads while the caller goes on
    (``ddpkit run`` loads torch's launcher meanwhile), not when the first worker is asked
    for. Returns the start method, as :func:`warm_start_method`.

    The server starts with this process's environment plus ``server_env`` (the workers'
    settings ddpkit adds, such as ``OMP_NUM_THREADS``, which libraries read when they load);
    variables already set are kept, as the workers keep them.

    Example::

        start_warm_server({"OMP_NUM_THREADS": "1"})   # as soon as the command line is parsed
    """
    method = warm_start_method()
    if method == "forkserver":
        server_env = {**server_env, WARM_SERVER_ENV: str(os.getpid())}
        added = {k: v for k, v in server_env.items() if k not in os.environ}
        os.environ.update(added)
        try:
            # the tracker first, alone: starting it unblocks SIGINT and SIGTERM (it ignores
            # them itself), which the server must not inherit unblocked
            with stop_signals_blocked():
                resource_tracker.ensure_running()
            with stop_signals_blocked():
                forkserver.ensure_running()
        finally:
            for name in added:
                os.environ.pop(name, None)
    return method


def restore_launch_environment(launch_env: Mapping[str, str]) -> None:
    """Make this worker's environment ``launch_env`` plus what torch set for this rank.

    Called first thing in a worker, after torch's wrapper wrote the rank's variables. A
    variable counts as torch's if it is one torch sets per rank, or if its value changed
    since the worker started.

    Example::

        restore_launch_environment({"PATH": "/usr/bin", "OMP_NUM_THREADS": "1"})
    """
    from_torch = {k: v for k, v in os.environ.items() if _set_for_this_rank(k, v)}
    os.environ.clear()
    os.environ.update(launch_env)
    os.environ.update(from_torch)


# What torch writes into the environment the first time it uses it, as the server's imports
# do: a fork would take the server's value for a choice of the user's.
_WRITTEN_BY_TORCH = ("TORCHINDUCTOR_CACHE_DIR",)


def forget_what_the_server_wrote() -> list[str]:
    """Drop the variables torch wrote into the server's environment and this worker took
    over with the fork (unless the launch set them): torch's compile cache folder, named
    after the server's temporary directory. ddpkit keeps a compiled run's kernels with its
    checkpoints unless the user chose a cache folder, and took that one for a choice of the
    user's. The names dropped.

    Example::

        forget_what_the_server_wrote()   # first thing in a forked worker
    """
    dropped = [n for n in _WRITTEN_BY_TORCH if n in os.environ and n not in _STARTING_ENV]
    for name in dropped:
        del os.environ[name]
    return dropped


def _set_for_this_rank(name: str, value: str) -> bool:
    per_rank = name in _PER_RANK or name.startswith(_PER_RANK_PREFIX)
    return per_rank or _STARTING_ENV.get(name) != value


def fresh_process_state(environ: Mapping[str, str] | None = None) -> None:
    """What a fresh interpreter would have that a function worker does not: the platform's
    default start method for the script's own processes (DataLoader workers, pools; Python
    set this worker's to the launcher's spawn or forkserver), torch's thread count from this
    launch's ``OMP_NUM_THREADS`` (a warm server's torch read the server's at import), no
    variable torch wrote into the server's environment (its compile cache folder), and
    NumPy's global generator seeded anew (else every forked rank draws the same).

    Example::

        fresh_process_state()   # first thing in a function worker (Tied does it)
    """
    multiprocessing.set_start_method(None, force=True)
    forget_what_the_server_wrote()
    threads = (os.environ if environ is None else environ).get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # from the OS's entropy, as at a fresh import


# The signals that stop a job (torch's agent passes them on). The warm server and Python's
# resource tracker start with them blocked (SIGINT they ignore themselves), so that one sent
# to every process of the job (SLURM's scancel, scancel --signal=USR1) ends neither: the
# server's end would close the pipes through which torch's agent learns how each worker
# ended, and every worker would read as failed (exit 255) before any could checkpoint; the
# tracker's would print a traceback for every lock a worker frees.
STOP_SIGNALS = frozenset(getattr(signal, name) for name in FORWARDED_SIGNALS)


def ignored_stop_signals() -> frozenset[int]:
    """The stop signals this process ignores (a background job ignores SIGINT, ``nohup``
    SIGHUP): a fresh worker started here would ignore them too. Read on the main thread.

    Example:
        >>> signal.SIGKILL in ignored_stop_signals()
        False
    """
    return frozenset(sig for sig in STOP_SIGNALS if signal.getsignal(sig) == signal.SIG_IGN)


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Around the start of the server and its resource tracker: they inherit the blocked
    stop signals (a mask survives fork and exec), and a signal this launcher gets meanwhile
    waits, it is not lost. The server still leaves with its launcher (Python's forkserver
    ends when the launcher's end of its pipe closes); each worker unblocks them first thing
    (:func:`fresh_signal_state`).

    Example::

        with stop_signals_blocked():
            forkserver.ensure_running()
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS - {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def fresh_signal_state(ignored: frozenset[int] = frozenset()) -> None:
    """Give this worker the signal state a fresh ``python script.py`` under the same launcher
    has: no signal blocked in its main thread, Ctrl-C's SIGINT raising KeyboardInterrupt and
    the other stop signals ending it (each ignored only where the launcher itself ignored it,
    as a background job's SIGINT, ``nohup``'s SIGHUP: ``ignored``).

    A function worker inherits its creator's instead: the warm server blocks every stop
    signal (:func:`stop_signals_blocked`), Python's forkserver puts back the SIGINT handler
    it found when it started, a server's main thread blocks signals while it starts a
    resource tracker, and torch's wrapper makes SIGINT the worker's parent-death signal; a
    script that catches KeyboardInterrupt or SIGTERM must not depend on which of these its
    worker saw.

    Example::

        fresh_signal_state()   # first thing in a function worker
    """
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for sig in STOP_SIGNALS:
        default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
        signal.signal(sig, signal.SIG_IGN if sig in ignored else default)


def take_launcher_stdin() -> None:
    """Give this forked worker the launcher's standard input, as a fresh ``python script.py``
    under ``ddpkit run`` has (``input()``, ``breakpoint()``); Python's forkserver closed it
    before forking. Does nothing outside a server ``ddpkit run`` started.

    Example::

        take_launcher_stdin()   # first thing in a worker forked by the warm server
    """
    global _launcher_stdin
    if _launcher_stdin is None:
        return
    os.dup2(_launcher_stdin, 0)
    os.close(_launcher_stdin)
    _launcher_stdin = None
    sys.stdin = open(0, encoding=sys.stdin.encoding, closefd=False)  # noqa: SIM115 (it is stdin)


def _serve_like_a_launch() -> int | None:
    """In the server ``ddpkit run`` started (this module is one it preloads): keep a copy of
    the launcher's stdin for the workers, and leave at once when the launcher is gone. A
    server that ends as Python does, tearing torch down, held the launcher's output open
    for 0.7-0.9 s after the job ended (a caller reading it waited)."""
    if os.environ.get(WARM_SERVER_ENV) != str(os.getppid()):
        return None
    server = os.getpid()
    atexit.register(lambda: os.getpid() == server and os._exit(0))  # not in a forked worker
    try:
        return os.dup(0)
    except OSError:  # the launcher had no stdin
        return None


def _in_a_server() -> bool:
    """Whether this process is a forkserver importing its preloads: Python starts one with
    ``-c "from multiprocessing.forkserver import main; main(...)"``."""
    return any(arg.startswith("from multiprocessing.forkserver import") for arg in sys.orig_argv)


def _pause_collector_for_preloads() -> bool:
    """In a server: the cyclic collector off while it imports (0.45 s of 1.7 s here: see
    :mod:`ddpkit._core.interpreter`) and for good in the server, which forks and makes
    little; every process it forks turns it back on first thing, whatever it runs."""
    if not (_in_a_server() and gc.isenabled()):
        return False
    gc.disable()
    os.register_at_fork(after_in_child=gc.enable)
    return True


def freeze_preloads() -> None:
    """In a server whose collector is paused, once its preloads are imported: move what they
    made out of the collector's reach (``gc.freeze``), so that a fork's collections never
    walk it: they would take time and copy every page the server's objects are on.

    Example::

        freeze_preloads()   # the server's last preload (ddpkit.launch.warm.serverready)
    """
    if _collector_paused:
        gc.freeze()


_launcher_stdin = _serve_like_a_launch()
_collector_paused = _pause_collector_for_preloads()
