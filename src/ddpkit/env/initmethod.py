"""Where ranks meet: the tutorials' ``--dist-url`` forms, and FileStores left by killed runs.

Three forms are accepted, as ``torch.distributed`` knows them: ``env://`` (MASTER_ADDR and
MASTER_PORT from the environment), ``tcp://HOST:PORT`` (rank 0 listens there) and
``file:///PATH`` (a file every rank can reach, on one machine or a shared file system).
Windows paths work in file URLs: ``file:///D:\\pg`` and ``file:///D:/pg`` both mean ``D:\\pg``.

Example:
    >>> parse_init_method("tcp://10.0.0.1:23456")
    InitMethod(kind='tcp', host='10.0.0.1', port=23456, path=None)
    >>> parse_init_method("file:///D:/pg").path
    'D:/pg'
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ddpkit.errors import ConfigError, RendezvousError

ACCEPTED_FORMS = "env://, tcp://HOST:PORT, file:///ABSOLUTE/PATH (Windows: file:///D:/pg)"
_WINDOWS_DRIVE = re.compile(r"^/?([A-Za-z]:[\\/].*)$")


@dataclass(frozen=True)
class InitMethod:
    """A parsed init URL: ``kind`` is "env", "tcp" or "file".

    Example:
        >>> InitMethod("env").kind
        'env'
    """

    kind: str
    host: str | None = None
    port: int | None = None
    path: str | None = None


def parse_init_method(url: str) -> InitMethod:
    """Parse an init URL, or raise ConfigError naming the accepted forms.

    Example:
        >>> parse_init_method("file:///tmp/pg").path
        '/tmp/pg'
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("env", "tcp", "file"):
        raise ConfigError(
            f"init method {url!r} is not understood; accepted forms: {ACCEPTED_FORMS}"
        )
    if scheme == "env":
        return InitMethod("env")
    if scheme == "tcp":
        return _parse_tcp(url, rest)
    return InitMethod("file", path=_parse_file_path(url, rest))


def _parse_tcp(url: str, rest: str) -> InitMethod:
    host, _, port = rest.rstrip("/").rpartition(":")
    host = host.strip("[]")  # [::1]:29500
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"init method {url!r} needs a host and a port 1..65535, like tcp://10.0.0.1:23456; "
            f"accepted forms: {ACCEPTED_FORMS}"
        )
    return InitMethod("tcp", host=host, port=int(port))


def _parse_file_path(url: str, rest: str) -> str:
    # file:///D:\pg and file:///D:/pg: a drive letter after the third slash is a Windows path.
    # file://D:/pg (two slashes) is a common slip for the same thing.
    windows = _WINDOWS_DRIVE.match(rest)
    if windows:
        return windows.group(1)
    if not rest.startswith("/") or rest == "/":
        raise ConfigError(
            f"init method {url!r} needs an absolute path after file:// (three slashes on "
            f"Linux: file:///tmp/pg); accepted forms: {ACCEPTED_FORMS}"
        )
    return rest


def clear_stale_file_store(path: str, rank: int, join_timeout: float) -> None:
    """Make sure a FileStore file left by an earlier, killed run cannot freeze this one.

    A file not written for longer than the join timeout cannot belong to a rendezvous still
    in progress (its ranks would have given up), so it is stale. Rank 0 removes it and says
    so; other ranks wait up to the join timeout for rank 0 to replace it, then stop with an
    error naming the file.

    Example:
        >>> clear_stale_file_store("/tmp/no-such-store", rank=0, join_timeout=30)
    """
    if not _is_stale(path, join_timeout):
        return
    if rank == 0:
        age = time.time() - os.stat(path).st_mtime
        Path(path).unlink(missing_ok=True)
        print(
            f"ddpkit: removed stale FileStore file {path} (last written {age:.0f} s ago, "
            "left by an earlier run that did not exit cleanly)",
            flush=True,
        )
        return
    deadline = time.monotonic() + join_timeout
    while time.monotonic() < deadline and _is_stale(path, join_timeout):
        time.sleep(0.2)
    if _is_stale(path, join_timeout):
        raise RendezvousError(
            f"FileStore file {path} is left from an earlier run (not written for over "
            f"{join_timeout:.0f} s) and rank 0 did not replace it within {join_timeout:.0f} s. "
            f"Is rank 0 running with the same init method? If not, delete the file (rm {path}) "
            "or use a new path, then start again."
        )


def _is_stale(path: str, join_timeout: float) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime > join_timeout
    except FileNotFoundError:
        return False
