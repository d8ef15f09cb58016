"""Where ranks meet: the tutorials' ``--dist-url`` forms, parsed.

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

import re
from dataclasses import dataclass

from ddpkit._core.text import split_host_port
from ddpkit.errors import ConfigError

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
    endpoint = split_host_port(rest)  # [::1]:29500 too
    if endpoint is None:
        raise ConfigError(
            f"init method {url!r} needs a host and a port 1..65535, like tcp://10.0.0.1:23456; "
            f"accepted forms: {ACCEPTED_FORMS}"
        )
    return InitMethod("tcp", host=endpoint[0], port=endpoint[1])


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
