"""A launch's scratch folder in the temporary directory, and the sweep of dead launchers' ones.

Each launch keeps its workers' logs and error files in ``ddpkit-launch-*`` under the temporary
directory and removes it when it ends. A launcher killed with ``kill -9`` (an OOM killer, a
scheduler) cannot, so the next launch removes the folders whose launcher is gone. A launcher
holds an exclusive ``flock`` on its folder's ``owner`` file while it runs: the kernel drops it
when the process dies, however it dies, so a lock the sweep can take marks a dead launcher.
Unlike a pid, a lock is not fooled by a reused pid or by another container's pid namespace
sharing ``/tmp``.

Example:
    >>> with launch_folder() as folder:
    ...     os.path.basename(folder).startswith(PREFIX)
    True
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ddpkit._core.filelock import LockHolder, holding, lock_holder

PREFIX = "ddpkit-launch-"
OWNER = "owner"  # the file a live launcher holds locked
SWEPT = ".swept"  # a dead launcher's folder being removed (by a sweep that may have been killed)
# A folder without an owner file is being made right now, or was left by a ddpkit before
# owner files: only the latter is this old.
UNOWNED_AFTER_S = 24 * 3600
MEMORY_ROOT = "/dev/shm"  # memory, not disk, on Linux: what a restarted worker reads fast


@contextlib.contextmanager
def launch_folder(root: str | None = None) -> Iterator[str]:
    """A fresh scratch folder (mode 0700) under ``root`` (the temporary directory), locked
    as this launcher's while the block runs, then removed; the folders of dead launchers
    there are removed first."""
    sweep_dead_launchers(root)
    folder = tempfile.mkdtemp(prefix=PREFIX, dir=root)
    with _locked_owner(folder):
        try:
            yield folder
        finally:
            # Renamed first, as a sweep does: a launcher killed while removing it (a
            # test's or a scheduler's kill -9 right after the job ended) leaves a folder
            # the next sweep finishes, not an owner-less half of one kept for a day.
            _remove(Path(folder))


@contextlib.contextmanager
def memory_folder(wanted: bool, root: str = MEMORY_ROOT) -> Iterator[str | None]:
    """The job's folder in the node's memory, for the workers' step snapshots
    (:mod:`ddpkit.train.snapshots`): a launch folder under ``root``, so a killed launcher's
    memory is given back by the next launch. None when not ``wanted`` or the node has no
    such place (then a restart resumes from the checkpoint folder).

    Example:
        >>> with memory_folder(False) as folder:
        ...     folder is None
        True
    """
    if not wanted or not os.path.isdir(root) or not os.access(root, os.W_OK | os.X_OK):
        yield None
        return
    with launch_folder(root) as folder:
        yield folder


@contextlib.contextmanager
def _locked_owner(folder: str) -> Iterator[None]:
    """The folder's owner file, locked from the moment it exists: it is made and locked
    under another name, then renamed into place (a lock is the open file's, and a rename
    keeps the file). An owner file made and then locked would be, for a moment, one a
    concurrent sweep could lock, taking a live launcher's folder for a dead one's."""
    making = os.path.join(folder, f".{OWNER}.making")
    with holding(making):
        os.rename(making, os.path.join(folder, OWNER))
        yield


def sweep_dead_launchers(root: str | None = None) -> list[str]:
    """Remove the scratch folders under ``root`` (the temporary directory) whose launcher is
    gone; the ones removed.

    Example:
        >>> sweep_dead_launchers("/nonexistent")
        []
    """
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(PREFIX + "*"):
        if not folder.is_dir():
            continue
        if folder.name.endswith(SWEPT) or _owner_is_gone(folder):
            _remove(folder)
            removed.append(str(folder))
    return removed


def _remove(folder: Path) -> None:
    """Rename, then remove: a dead launcher's workers may still be ending and write their
    error files by path, and under the new name they find nothing to write into (rather
    than a half-removed folder that ``rmtree`` would then fail to finish)."""
    swept = folder if folder.name.endswith(SWEPT) else folder.with_name(folder.name + SWEPT)
    try:
        folder.rename(swept)
    except OSError:  # another launch is sweeping it right now
        return
    shutil.rmtree(swept, ignore_errors=True)


def _owner_is_gone(folder: Path) -> bool:
    holder = lock_holder(folder / OWNER)
    if holder is LockHolder.NO_FILE:
        return _age_s(folder) > UNOWNED_AFTER_S
    return holder is LockHolder.NOBODY  # not a live launcher's, nor another user's


def _age_s(folder: Path) -> float:
    try:
        return time.time() - folder.stat().st_mtime
    except OSError:
        return 0.0
