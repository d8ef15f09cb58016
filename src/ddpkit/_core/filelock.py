"""``flock`` on a file, the one way ddpkit tells a live process's file from a dead one's.

The kernel drops a process's ``flock`` when the process ends, however it ends (``kill -9``
included), so a lock nobody holds means nobody alive uses the file: a launcher's scratch
folder, a ``file://`` store, a node's compile-cache unpack.

Example:
    >>> lock_holder("/no/such/file")
    <LockHolder.NO_FILE: 'no file'>
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import os
from collections.abc import Iterator
from typing import IO


class LockHolder(enum.Enum):
    """Who holds a file's lock, as :func:`lock_holder` finds out without waiting.

    Example:
        >>> LockHolder.LIVE_PROCESS.value
        'a live process'
    """

    NO_FILE = "no file"
    NOBODY = "nobody"
    LIVE_PROCESS = "a live process"
    UNKNOWN = "unknown"  # no flock on this file system, or the file is not ours to open


def lock_holder(path: str | os.PathLike[str]) -> LockHolder:
    """Whether a live process holds ``path``'s lock (shared or exclusive), asked without
    waiting; taking the lock to ask, it is released at once.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     with holding(f"{folder}/lock"):
        ...         held = lock_holder(f"{folder}/lock")
        ...     held, lock_holder(f"{folder}/lock")
        (<LockHolder.LIVE_PROCESS: 'a live process'>, <LockHolder.NOBODY: 'nobody'>)
    """
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return LockHolder.NO_FILE
    except OSError:
        return LockHolder.UNKNOWN
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return LockHolder.NOBODY
    except BlockingIOError:
        return LockHolder.LIVE_PROCESS
    except OSError:
        return LockHolder.UNKNOWN
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def holding(path: str | os.PathLike[str]) -> Iterator[IO[str]]:
    """``path`` (made if missing) held locked, exclusively, for the ``with`` block; waits
    for another holder to let go. The lock is the open file's, so a rename inside the block
    keeps it.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder, holding(f"{folder}/.lock"):
        ...     pass
    """
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield handle
