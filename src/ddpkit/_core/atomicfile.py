"""Files written whole or not at all: a temporary beside the target, synced, then renamed
over it, and the folder synced so that the rename survives a power cut. A reader (torch's
agent reading an error file, doctor reading save times, a user opening a trace or a
checkpoint) never sees half a file, and a writer killed midway leaves the old one.

Example:
    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp()) / "notes.txt"
    >>> atomic_write(target, lambda handle: handle.write(b"ok")); target.read_bytes()
    b'ok'
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def atomic_write(
    final: Path, write: Callable[[IO[bytes]], Any], make_folder: bool = True, durable: bool = True
) -> None:
    """Write ``final`` through ``write(handle)`` so it is either complete or not there.
    ``make_folder=False``: a missing folder is an error (``FileNotFoundError``) rather than
    made, for a file whose folder belongs to someone else and may have been removed.
    ``durable=False``: no fsync, for a file no one reads after a power cut (a worker's
    record for its launcher): whole or not there still holds for a killed writer, and an
    fsync can cost milliseconds on a busy or network disk.

    Example:
        >>> target = Path(tempfile.mkdtemp()) / "notes.bin"
        >>> atomic_write(target, lambda handle: handle.write(b"ok")); target.read_bytes()
        b'ok'
    """
    if make_folder:
        final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp_name, final)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    if durable:
        fsync_directory(final.parent)


def fsync_directory(folder: Path) -> None:
    """Make a rename in ``folder`` durable: it is only on disk once the directory entry is.

    Example:
        >>> import tempfile
        >>> fsync_directory(Path(tempfile.mkdtemp()))
    """
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
