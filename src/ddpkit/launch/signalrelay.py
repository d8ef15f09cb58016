"""A function worker's stop signal passed on to the processes it started, as torch does for
a fresh one.

torch's agent stops a fresh worker (``python script.py``) by signalling its whole process
group (``os.killpg``): the worker leads a session of its own, and what the script started
(DataLoader workers, a ``multiprocessing.Pool``, a ``subprocess``) is in its group and gets
the signal too. A worker started from a function (``ddpkit run --run-path``, warm or not)
gets it alone (``os.kill``), and what it started would run on. This module relays the
signal to the rest of the worker's group the moment it arrives, whatever the main thread
is doing: Python's own signal handler writes each signal's number into a pipe
(``signal.set_wakeup_fd``), which a thread reads. A handler that ends the process at once
relays what is pending first (:func:`relay_pending`). A signal whose action is the default
one (``SIGHUP``, ``SIGQUIT``: the kernel ends the process, no Python handler runs, nothing
reaches the pipe) gets a handler that relays it, then ends the process by that same signal,
as the default would have. A ``SIGKILL`` (torch's last resort, 30 s later) cannot be
relayed; a child that outlives the stop signal then outlives its worker.

Example::

    relay_stop_signals_to_group()   # in a function worker, after os.setsid()
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading

from ddpkit._core.protocol import FORWARDED_SIGNALS

# The signals torch's agent stops workers with: SIGTERM, or the one that stopped the agent.
RELAYED = frozenset(getattr(signal, name) for name in FORWARDED_SIGNALS)

_pipe: list[int] = []  # its read and write ends, once relaying
_lock = threading.Lock()  # a signal's number is read and relayed under it, by one reader


def relay_stop_signals_to_group() -> bool:
    """Relay every stop signal this process receives to the rest of its process group,
    from now on; True if relaying (Linux, main thread, this process leads its group).

    Example::

        relay_stop_signals_to_group()   # True in a worker that called os.setsid()
    """
    leads = os.getpgrp() == os.getpid()
    if _pipe or not leads or not os.path.isdir("/proc"):
        return bool(_pipe)
    read, write = os.pipe()  # not inherited by what the script executes
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    try:
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        os.close(read)
        os.close(write)
        return False
    _pipe[:] = [read, write]
    os.register_at_fork(after_in_child=_forget_in_child)
    for sig in RELAYED:  # a default action would end the process before any relay
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _relay_then_default)
    # The thread is made with the relayed signals blocked (a thread inherits its creator's
    # mask), so the kernel never hands it one: they reach the main thread, whose blocking
    # call then ends (EINTR) and whose Python handler runs at once. A signal taken by the
    # thread would leave the main thread asleep in its call (signal.pause() never returns).
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, RELAYED)
    try:
        threading.Thread(target=_relay_forever, name="ddpkit-signal-relay", daemon=True).start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
    return True


def _relay_then_default(signum: int, _frame: object) -> None:
    """A relayed signal whose action was the default: relayed, then the default taken (the
    process ends by that signal, its exit status as before)."""
    relay_pending()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def relay_pending() -> None:
    """Relay the signals received and not relayed yet, now: called by a handler that ends
    the process at once, before the relay thread might have had its turn. Returns once
    every signal received so far has been relayed, by this call or by the thread.

    Example::

        relay_pending(); os._exit(75)
    """
    if not _pipe:
        return
    with _lock, contextlib.suppress(BlockingIOError):
        _relay(os.read(_pipe[0], 64))


def _relay_forever() -> None:
    while _pipe:
        select.select([_pipe[0]], [], [])  # reads nothing: what is read is relayed at once
        relay_pending()


def _relay(received: bytes) -> None:
    stops = [signal.Signals(n) for n in dict.fromkeys(received) if n in RELAYED]
    members = group_members() if stops else []
    for sig in stops:
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def group_members() -> list[int]:
    """The other processes of this process's group, read from ``/proc``.

    Example::

        group_members()   # [4242, 4243]: the DataLoader workers this rank forked
    """
    group, me, members = os.getpgrp(), os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me and _group_of(entry) == group:
            members.append(int(entry))
    return members


def _group_of(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):  # gone meanwhile
        return None
    return int(fields[2])  # after the name: state, parent, group


def _forget_in_child() -> None:
    """A process the worker forks does not relay: its own stop would go round again."""
    if _pipe:
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)
        for end in _pipe:
            os.close(end)
        _pipe.clear()
