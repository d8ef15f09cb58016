"""Folders that only this user can write: where ddpkit keeps what it will run (compiled kernels).

A folder in a place others can write to (the system's temporary folder, a team's share) may
have been made, or filled, by someone else before ddpkit looks: code loaded from it would
run as this user. A private folder is made with mode 0700 and, whether made now or found,
is used only if it is a real folder (not a link), owned by this user, and not writable by
its group or by everyone; else :class:`~ddpkit.errors.UnsafeFolderError` names it.

Example:
    >>> import tempfile
    >>> folder = private_folder(Path(tempfile.mkdtemp()) / "kernels")
    >>> oct(folder.stat().st_mode & 0o777)
    '0o700'
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from ddpkit.errors import UnsafeFolderError


def private_folder(path: Path) -> Path:
    """``path``, made with mode 0700 if missing (its missing parents too), and checked.

    Example::

        private_folder(Path.home() / ".cache" / "ddpkit")
    """
    for missing in reversed([path, *path.parents]):
        if not os.path.lexists(missing):
            with contextlib.suppress(FileExistsError):  # made meanwhile by another rank
                missing.mkdir(mode=0o700)
    check_private(path)
    return path


def check_private(path: Path) -> None:
    """Raise :class:`UnsafeFolderError` unless ``path`` is a folder, not a link, that this
    user owns and that neither its group nor everyone can write.

    Example:
        >>> import tempfile
        >>> check_private(Path(tempfile.mkdtemp()))  # mkdtemp makes it 0700: no error
    """
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeFolderError(str(path), "it is a link or not a folder")
    if info.st_uid != os.geteuid():
        owner = f"it belongs to user id {info.st_uid}, not to you ({os.geteuid()})"
        raise UnsafeFolderError(str(path), owner)
    writable = [who for who, bit in (("its group", stat.S_IWGRP), ("everyone", stat.S_IWOTH))
                if info.st_mode & bit]  # fmt: skip
    if writable:
        mode = f"mode {info.st_mode & 0o7777:04o}"
        raise UnsafeFolderError(str(path), f"it is writable by {' and '.join(writable)} ({mode})")


def user_cache_root(environ: dict[str, str] | None = None) -> Path:
    """Where this user's ddpkit caches go on this machine: ``$XDG_CACHE_HOME/ddpkit`` when set,
    else ``ddpkit-<uid>`` in the temporary folder (node-local, as torch's own
    ``torchinductor_<user>``). Not made here (:func:`private_folder` makes it).

    Example:
        >>> user_cache_root({"XDG_CACHE_HOME": "/home/me/.cache"})
        PosixPath('/home/me/.cache/ddpkit')
    """
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "ddpkit"
    return Path(tempfile.gettempdir()) / f"ddpkit-{os.geteuid()}"
