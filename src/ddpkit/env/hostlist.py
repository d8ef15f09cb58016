"""SLURM's compressed host lists: ``gpu[01-04,07]``, ``a1,b[2-3]``, ``n[1-2]-ib``.

SLURM publishes the nodes of a job as one compressed string (``SLURM_JOB_NODELIST``); the
first host is where rank 0 runs, so it becomes the master address. Zero padding is kept
(``gpu[08-10]`` gives gpu08, gpu09, gpu10).

Example:
    >>> expand_hostlist("gpu[01-03,07],cpu1")
    ['gpu01', 'gpu02', 'gpu03', 'gpu07', 'cpu1']
"""

from __future__ import annotations

import re

from ddpkit.errors import ConfigError

_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def expand_hostlist(spec: str) -> list[str]:
    """All host names of a SLURM host list, in order.

    Example:
        >>> expand_hostlist("a1,b[2-3]")
        ['a1', 'b2', 'b3']
    """
    hosts: list[str] = []
    for item in split_hostlist(spec.strip()):
        hosts.extend(_expand_item(item, spec))
    if not hosts:
        raise ConfigError(f"host list {spec!r} names no hosts")
    return hosts


def split_hostlist(spec: str) -> list[str]:
    """Split on the commas that are not inside brackets.

    Example:
        >>> split_hostlist("gpu[01-02]:4,b")
        ['gpu[01-02]:4', 'b']
    """
    items, depth, start = [], 0, 0
    for i, char in enumerate(spec):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise ConfigError(f"host list {spec!r} has unbalanced or nested brackets")
        if char == "," and depth == 0:
            items.append(spec[start:i])
            start = i + 1
    if depth != 0:
        raise ConfigError(f"host list {spec!r} has an unclosed '['")
    items.append(spec[start:])
    return [item for item in items if item]


def _expand_item(item: str, spec: str) -> list[str]:
    match = _BRACKET.search(item)
    if match is None:
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    return [
        host
        for number in _expand_ranges(match.group(1), spec)
        for host in _expand_item(head + number + tail, spec)  # more brackets later in the name
    ]


def _expand_ranges(ranges: str, spec: str) -> list[str]:
    numbers: list[str] = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ConfigError(f"host list {spec!r}: {part!r} is not a number or a range like 01-04")
        if not high:
            numbers.append(low)
            continue
        if int(high) < int(low):
            raise ConfigError(f"host list {spec!r}: range {part!r} runs backwards")
        width = len(low)  # SLURM keeps the zero padding of the lower bound
        numbers.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return numbers
