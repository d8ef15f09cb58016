"""Small text helpers: an error's first line, a list of ranks, HOST:PORT, a short name from a
long text.

Example:
    >>> ranks_text([1, 3]), first_line(ValueError("bad\\nmore"))
    ('ranks 1,3', 'bad')
"""

from __future__ import annotations

import hashlib

from ddpkit.errors import ConfigError


def first_line(err: BaseException | str) -> str:
    """The first line of an error's message (its type's name when it has none).

    Example:
        >>> first_line(RuntimeError())
        'RuntimeError'
    """
    text = str(err).strip()
    if text:
        return text.splitlines()[0]
    return type(err).__name__ if isinstance(err, BaseException) else ""


def ranks_text(ranks: list[int], most: int | None = None) -> str:
    """'rank 3' or 'ranks 1,3', for messages; past ``most`` ranks, how many more.

    Example:
        >>> ranks_text([2]), ranks_text([0, 1, 2, 3], most=2)
        ('rank 2', 'ranks 0,1 and 2 more')
    """
    shown = ranks if most is None else ranks[:most]
    more = f" and {len(ranks) - len(shown)} more" if len(shown) < len(ranks) else ""
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, shown)) + more


def split_host_port(text: str) -> tuple[str, int] | None:
    """``("10.0.0.1", 29500)`` from ``"10.0.0.1:29500"`` (``[::1]:29500`` too); None if not.

    Example:
        >>> split_host_port("[::1]:29500"), split_host_port("host:99999")
        (('::1', 29500), None)
    """
    host, _, port = text.rstrip("/").rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def parse_endpoint(text: str | None, flag: str) -> tuple[str, int]:
    """``"ADDR:PORT"`` as (host, port), or a ConfigError naming the flag it came from.

    Example:
        >>> parse_endpoint("10.0.0.1:29500", "--master")
        ('10.0.0.1', 29500)
        >>> parse_endpoint("10.0.0.1", "--master")
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: --master '10.0.0.1' is not ADDR:PORT (like 10.0.0.1:29500)
    """
    endpoint = split_host_port(text or "")
    if endpoint is None:
        raise ConfigError(f"{flag} {text!r} is not ADDR:PORT (like 10.0.0.1:29500)")
    return endpoint


def short_digest(text: str, length: int = 16) -> str:
    """The first ``length`` hex digits of ``text``'s SHA-256: a folder or a number named by
    a long text (a store's URL, a machine's fingerprint), the same on every host.

    Example:
        >>> short_digest("s3://bucket/run"), len(short_digest("x", 15))
        ('03236a01105588c1', 15)
    """
    return hashlib.sha256(text.encode()).hexdigest()[:length]
