"""The hang at the collective level, in one line, from every rank's Flight Recorder.

Each rank that answers a hang alarm sends its last collectives per process group
(:mod:`ddpkit.flightrecorder.records`). Ranks running the same code issue the same collectives
in the same order, so their sequence numbers agree; where they do not, the numbers say what
happened:

- a rank *behind*: it never issued the collective the others wait in (it is elsewhere: a
  skipped batch or backward, a collective on some ranks only);
- every rank at the same number but with another op, size or dtype: they *disagree*
  (rank-dependent control flow, unused parameters, a metric reduced on one rank);
- every rank waits in the same call, issued alike: it does not complete (the network);
- a rank that did not answer (stopped, frozen in native code) is named as such.

Example:
    >>> waiting = {"seq": 2, "op": "all_reduce", "group": "default_pg", "sizes": [[7]],
    ...            "dtypes": ["Float"], "done": False, "where": "train.py:9 (main)"}
    >>> before = {**waiting, "seq": 1, "sizes": [[3]], "done": True, "where": "train.py:7 (main)"}
    >>> print(collective_verdict({0: {"collectives": [before, waiting], "for_s": 12.0},
    ...                           1: {"collectives": [before], "for_s": 0}}).line)
    ... # doctest: +NORMALIZE_WHITESPACE
    rank 1 never issued all_reduce #2 of the default group (7 float32); rank 0 waits in it
    since 12 s, called from train.py:9 (main); rank 1's last collective there was #1 at
    train.py:7 (main)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ddpkit._core.text import ranks_text

Call = dict[str, Any]
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Byte": "uint8", "Bool": "bool"}  # fmt: skip


class Cause(str, enum.Enum):
    """What the ranks' collectives say happened; each has its fix (:data:`FIXES`).

    Example:
        >>> Cause.MISSING.value
        'missing'
    """

    MISSING = "missing"  # a rank never issued the collective the others wait in
    DISAGREE = "disagree"  # same place, another op, size or dtype
    SILENT = "silent"  # a rank could not say (stopped, frozen in native code)
    STUCK = "stuck"  # every rank issued it alike; it does not complete


FIXES = {
    Cause.MISSING: "the missing rank is elsewhere (its stack says where): a skipped batch or "
    "backward, a collective or a metric on some ranks only, rank-dependent control flow",
    Cause.DISAGREE: "every rank must issue the same collectives, with the same sizes and "
    "dtypes, in the same order: rank-dependent control flow, unused parameters "
    "(find_unused_parameters), a batch of another shape",
    Cause.SILENT: "look at that rank's host: a stopped or swapped-out process, a hung "
    "driver; its faulthandler dump is in its own output",
    Cause.STUCK: "the network between them: run `ddpkit doctor --nodes` on those hosts",
}


@dataclass(frozen=True)
class Verdict:
    """One line naming ranks and collective, the cause, and its fix.

    Example:
        >>> Verdict(Cause.STUCK, "ranks 0,1 issued all_reduce #3 alike").fix[:11]
        'the network'
    """

    cause: Cause
    line: str

    @property
    def fix(self) -> str:
        """What to do about it."""
        return FIXES[self.cause]


def collective_verdict(
    states: dict[int, dict[str, Any]],
    world_size: int = 0,
    pending_only: bool = True,
    aborted: tuple[int, ...] = (),
) -> Verdict | None:
    """The ranks and the collective, or None when no collective is pending (the hang is in
    Python code, or no rank's Flight Recorder was readable). After a failure
    (``pending_only=False``) the newest collective counts whether it completed or failed;
    ``aborted`` ranks died by SIGABRT leaving no record, which is how gloo ends a rank that
    receives a message of another size than its own collective expects.

    Example:
        >>> collective_verdict({0: {"collectives": []}}) is None
        True
    """
    recorded = {rank: s["collectives"] for rank, s in states.items() if s.get("collectives")}
    pending = _first_pending(recorded, pending_only)
    if pending is None:
        return None
    group, seq = pending["group"], pending["seq"]
    lasts = {rank: _last_in(calls, group) for rank, calls in recorded.items()}
    behind = sorted(r for r, last in lasts.items() if last is None or last["seq"] < seq)
    unrecorded = set(states) - set(recorded) - set(aborted)
    silent = sorted(unrecorded | {r for r in range(world_size) if r not in states})
    at_seq = {r: last for r, last in sorted(lasts.items()) if last and last["seq"] == seq}
    waiting = list(at_seq)
    first = waiting[0]
    since = states[first].get("for_s")
    called = at_seq[first]
    if behind:
        return Verdict(Cause.MISSING, _behind(called, behind, lasts, first, since))
    if len({_shape(call) for call in at_seq.values()}) > 1:
        return Verdict(Cause.DISAGREE, _disagree(group, seq, at_seq))
    if aborted:
        return Verdict(Cause.DISAGREE, (
            f"{_waits(first, called, since, named=True)}; {ranks_text(list(aborted))} aborted "
            "(SIGABRT) meanwhile, as gloo aborts a rank sent another size than its own "
            "collective expects: the ranks disagree there (`ddpkit run --debug-collectives` "
            "shows both sides)"
        ))  # fmt: skip
    if silent:
        return Verdict(Cause.SILENT, (
            f"{_waits(first, called, since, named=True)}; {ranks_text(silent)} did not answer "
            "(stopped, or frozen in native code): its Python stack and collectives are unknown"
        ))  # fmt: skip
    if all(call["done"] for call in at_seq.values()):
        return None  # after the fact: every rank completed the same call; nothing waits
    line = f"{ranks_text(waiting)} issued {_name(called)} alike and it does not complete"
    return Verdict(Cause.STUCK, line)


def _first_pending(recorded: dict[int, list[Call]], pending_only: bool) -> Call | None:
    """The not-yet-completed collective with the highest sequence number on any rank."""
    calls = [c for calls in recorded.values() for c in calls]
    pending = [c for c in calls if not c.get("done")] if pending_only else calls
    return max(pending, key=lambda c: c["seq"], default=None)


def _last_in(calls: list[Call], group: str) -> Call | None:
    mine = [c for c in calls if c["group"] == group]
    return max(mine, key=lambda c: c["seq"], default=None)


def _behind(
    called: Call, behind: list[int], lasts: dict[int, Call | None], first: int, since: Any
) -> str:
    text = f"{ranks_text(behind)} never issued {_name(called)}; {_waits(first, called, since)}"
    for rank in behind[:3]:
        last = lasts[rank]
        if last is None:
            text += f"; rank {rank} issued none in that group"
        else:
            text += f"; rank {rank}'s last collective there was #{last['seq']}" + _at(last)
    return text


def _disagree(group: str, seq: int, calls: dict[int, Call]) -> str:
    sides = [f"rank {r} {_what(c)}{_at(c)}" for r, c in calls.items()]
    return f"ranks disagree at collective #{seq} of the {group_name(group)} group: " + ", ".join(
        sides[:4]
    )


def _waits(rank: int, call: Call, since: Any, named: bool = False) -> str:
    it = _name(call) if named else "it"
    waited = f"waits in {it} since {float(since):.0f} s" if since is not None else f"was in {it}"
    return f"rank {rank} {waited}" + (f", called from {call['where']}" if call.get("where") else "")


def _name(call: Call) -> str:
    """``all_reduce #37 of the default group (DDP gradient bucket, 110 float32)``."""
    details = ", ".join(filter(None, [call.get("purpose"), _size(call)]))
    return f"{call['op']} #{call['seq']} of the {group_name(call['group'])} group" + (
        f" ({details})" if details else ""
    )


def _what(call: Call) -> str:
    return f"{call['op']} ({_size(call)})"


def _size(call: Call) -> str:
    counts = [_count(size) for size in call.get("sizes", [])]
    dtypes = [_DTYPES.get(d, d.lower()) for d in call.get("dtypes", [])]
    parts = [f"{n} {d}" for n, d in zip(counts, dtypes, strict=False)]
    return " + ".join(parts)


def _count(size: list[int]) -> int:
    total = 1
    for dim in size:
        total *= int(dim)
    return total


def _shape(call: Call) -> tuple[Any, ...]:
    return (call["op"], str(call.get("sizes")), str(call.get("dtypes")))


def _at(call: Call) -> str:
    return f" at {call['where']}" if call.get("where") else ""


def group_name(name: str) -> str:
    """``default`` for the default process group, else its name.

    Example:
        >>> group_name("default_pg")
        'default'
    """
    return "default" if name in ("default_pg", "0", "") else name
