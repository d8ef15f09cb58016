"""What the launcher of ``ddpkit run --hosts`` tells each host, as one JSON line on the ssh
session's standard input: never in ssh's command line, where ``ps`` on either machine would
show it (a forwarded API key), and never through a shell.

ssh runs one fixed command on every host (:data:`ENTRY`); the session's standard input then
carries, in order:

1. the :class:`HostOrder`: the folder, the preflight probe's questions, ``ddpkit run``'s
   arguments and the environment;
2. :data:`GO`, once every host answered the probe well (anything else, or the end of the
   input: nothing starts there);
3. nothing more: its end is the job's lifeline (the launcher stopped, killed or cut off).

The host answers the probe with one line, :data:`PROBE_ANSWER` and a JSON object.

Example:
    >>> order = HostOrder("/runs", Probe("file", "t.py", 29500, 1, None, 5.0), ["t.py"], {})
    >>> HostOrder.decode(order.encode()) == order
    True
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

ENTRY = "ddpkit.launch.remote.entry"  # what ssh runs there: PYTHON -m ENTRY, nothing else
GO = b"go\n"
PROBE_ANSWER = "ddpkit-probe "
MAX_ORDER_BYTES = 1 << 20  # an order is a few KB; a stream without a newline is not one


@dataclass(frozen=True)
class Probe:
    """What a host is asked before anything starts anywhere.

    ``kind`` and ``script``: what must be there (a file, a module, a program); ``port``:
    where the nodes meet; ``first``: the first host's address (None on the first host, which
    listens on ``port`` until its ``peers`` connected); ``link_timeout_s``: how long they try.

    Example:
        >>> Probe("module", "pkg.train", 29500, 0, "10.0.0.1", 5.0).first
        '10.0.0.1'
    """

    kind: str
    script: str
    port: int
    peers: int
    first: str | None
    link_timeout_s: float


@dataclass(frozen=True)
class HostOrder:
    """Everything one host is told: its folder, its probe, ``ddpkit run``'s arguments there,
    and the environment the job gets on top of the host's own.

    Example:
        >>> HostOrder("/runs", Probe("file", "t.py", 1, 0, None, 5.0), [], {"SEED": "3"}).env
        {'SEED': '3'}
    """

    cwd: str
    probe: Probe
    arguments: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        """One line of JSON, its newline included."""
        return json.dumps(asdict(self), separators=(",", ":")).encode() + b"\n"

    @classmethod
    def decode(cls, line: bytes) -> HostOrder:
        """The order a line holds; ValueError naming what is wrong with it.

        Example:
            >>> HostOrder.decode(b'{"cwd": 1}')
            Traceback (most recent call last):
            ...
            ValueError: an order's cwd is a string, not 1
        """
        raw = json.loads(line)
        if not isinstance(raw, dict):
            raise ValueError("an order is a JSON object")
        cwd = _checked(raw.get("cwd"), str, "cwd")
        probe = _checked(raw.get("probe"), dict, "probe")
        return cls(
            cwd=cwd,
            probe=Probe(
                kind=_checked(probe.get("kind"), str, "probe kind"),
                script=_checked(probe.get("script"), str, "probe script"),
                port=_checked(probe.get("port"), int, "probe port"),
                peers=_checked(probe.get("peers"), int, "probe peers"),
                first=_checked(probe.get("first"), (str, type(None)), "probe first"),
                link_timeout_s=float(
                    _checked(probe.get("link_timeout_s"), (int, float), "timeout")
                ),
            ),
            arguments=_strings(raw.get("arguments"), "arguments"),
            env=_environment(raw.get("env")),
        )


def _checked(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"an order's {what} is a {_kind_name(kind)}, not {value!r}")
    return value


_KIND_NAMES = {str: "string", int: "number", float: "number", dict: "object"}


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(_KIND_NAMES.get(k, "null") for k in kinds)


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(word, str) for word in value):
        raise ValueError(f"an order's {what} are a list of strings, not {value!r}")
    return list(value)


def _environment(value: Any) -> dict[str, str]:
    valid = isinstance(value, dict) and all(
        isinstance(k, str) and k.isidentifier() and isinstance(v, str) for k, v in value.items()
    )
    if not valid:
        raise ValueError("an order's env maps variable names to strings")
    return dict(value)
