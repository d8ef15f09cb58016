"""The ``file://`` rendezvous file, told apart from one that a killed run left behind.

torch's ``FileStore`` deletes its file when the last rank closes it cleanly. A run killed with
``kill -9`` (or by the OOM killer) leaves the file behind, full of the old run's keys: a new
run that opens it reads the old join verdict and the old ranks' gloo addresses, then hangs or
fails with "Connection refused". The file's age says little (it may be seconds old), so every
process using the file holds a shared ``flock`` on a companion ``PATH.lock`` for as long as it
lives; the kernel drops that lock when the process dies, however it dies. A rank that can take
the lock exclusively knows that no live process uses the file, so a file present then is left
over, and is removed. torch's ``FileStore`` itself relies on ``flock`` across hosts, so a file
system on which the store works supports this check too.

Example:
    >>> folder_problem("/no/such/folder/pg")
    '/no/such/folder does not exist'
"""

from __future__ import annotations

import fcntl
import os
import time
from datetime import timedelta
from pathlib import Path

from torch.distributed import FileStore, Store

from ddpkit._core.filelock import LockHolder, lock_holder
from ddpkit._core.log import EVERY_RANK, logger
from ddpkit.errors import ConfigError, RendezvousError

LOCK_SUFFIX = ".lock"
_COMPLETE = b"rendezvous complete"
_POLL_S = 0.1
_FOLDER_FIX = "create it (mkdir -p {0}) on a file system every rank can reach, or use another path"
_held: dict[str, int] = {}  # store path -> this process's descriptor holding its shared lock


def open_file_store(path: str, world_size: int, join_timeout: float) -> Store:
    """The ``FileStore`` at ``path``, after removing a file that only dead processes used.

    A file that live processes hold and that is marked complete (:func:`mark_complete`)
    belongs to an earlier job, still running or still exiting: this rank waits up to
    ``join_timeout`` for it to let go, without opening the file (a handle opened and closed
    there would upset torch's count of its users, and it would delete the file too early).

    Example::

        store = open_file_store("/tmp/pg", world_size=2, join_timeout=30)
    """
    problem = folder_problem(path)
    if problem is not None:
        raise ConfigError(f"file://{path}: {problem}; {_FOLDER_FIX.format(Path(path).parent)}")
    try:
        _claim(path, join_timeout)
    except _NoFlock as err:  # torch's FileStore needs flock as well, so this is rare
        logger.debug(f"flock is not supported for {path} ({err}); left-over files go unnoticed")
    store = FileStore(path, world_size)
    store.set_timeout(timedelta(seconds=join_timeout))
    return store


def mark_complete(path: str) -> None:
    """Record in ``PATH.lock`` that the rendezvous in ``path`` is over (rank 0, once all
    ranks joined): a rank arriving later belongs to another job.

    Example::

        mark_complete("/tmp/pg")
    """
    descriptor = _held.get(path)
    if descriptor is not None:
        os.pwrite(descriptor, _COMPLETE, 0)


def _claim(path: str, join_timeout: float) -> None:
    """Hold ``path``'s lock shared; first remove the file if no live process holds it."""
    deadline = time.monotonic() + join_timeout
    descriptor = _lock_file(path)
    while True:
        if _try_lock(descriptor, fcntl.LOCK_EX):  # no live process uses the file
            _remove_left_over(path)
            os.ftruncate(descriptor, 0)
            break
        if os.pread(descriptor, len(_COMPLETE), 0) != _COMPLETE:
            break  # the live holders are this job's ranks, still meeting
        if time.monotonic() > deadline:
            raise RendezvousError(
                f"{path} belongs to another job that is still running: it finished its "
                "rendezvous before this rank arrived, and its processes still held the file "
                f"after {join_timeout:.0f} s. Give each job its own file:// path, or wait "
                "for that job to end."
            )
        time.sleep(_POLL_S)
    _lock_shared(descriptor, path, deadline)


def folder_problem(path: str) -> str | None:
    """Why a store file cannot be made at ``path`` (its folder is missing or read-only), or None.

    Example:
        >>> folder_problem("/tmp/pg") is None
        True
    """
    folder = Path(path).parent
    if not folder.is_dir():
        return f"{folder} {'is not a directory' if folder.exists() else 'does not exist'}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is not writable by this user"
    return None


def holders_alive(path: str) -> bool | None:
    """Whether a live process holds ``path``'s lock (None: the file system cannot tell).

    Example:
        >>> holders_alive("/tmp/no-such-store")
        False
    """
    holder = lock_holder(path + LOCK_SUFFIX)
    return None if holder is LockHolder.UNKNOWN else holder is LockHolder.LIVE_PROCESS


class _NoFlock(Exception):
    """The file system does not support flock."""


def _lock_file(path: str) -> int:
    """This process's descriptor of ``PATH.lock``, held from now until the process exits."""
    previous = _held.pop(path, None)
    if previous is not None:  # this process's earlier session with the same file has ended
        os.close(previous)
    descriptor = os.open(path + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
    _held[path] = descriptor
    return descriptor


def _try_lock(descriptor: int, kind: int) -> bool:
    try:
        fcntl.flock(descriptor, kind | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as err:
        raise _NoFlock(str(err)) from err


def _lock_shared(descriptor: int, path: str, deadline: float) -> None:
    """Hold the lock shared; another rank may hold it exclusively for a moment."""
    while not _try_lock(descriptor, fcntl.LOCK_SH):
        if time.monotonic() > deadline:
            raise RendezvousError(f"could not lock {path}{LOCK_SUFFIX}: another process holds it")
        time.sleep(_POLL_S)


def _remove_left_over(path: str) -> None:
    try:
        age = time.time() - os.stat(path).st_mtime
        os.unlink(path)
    except FileNotFoundError:
        return
    logger.info(
        f"removed FileStore file {path} (written {age:.0f} s ago) left by a run whose "
        "processes are gone (killed, or crashed before closing it)",
        extra=EVERY_RANK,
    )
