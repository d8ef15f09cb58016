"""torch.profiler's Chrome traces, one per rank, made into one timeline of every rank.

A trace's event times (``ts``, microseconds) count from its ``baseTimeNanoseconds``, the wall
clock of the host that wrote it. :func:`merge` puts every rank's events on rank 0's clock
(each rank's measured offset subtracted, :mod:`.clocksync`), one process track
per rank named with its host, in rank order, so that Perfetto or chrome://tracing opens the
file as it is. :func:`cap` keeps a trace under a size by dropping its shortest operator
events first (the long ones are what a slow step is made of).

Example:
    >>> a = {"baseTimeNanoseconds": 0, "traceEvents": [
    ...     {"ph": "X", "name": "mm", "pid": 7, "tid": 7, "ts": 1000.0, "dur": 5.0}]}
    >>> merged = merge([TraceOf(0, "a", a, 0), TraceOf(1, "b", a, 250_000)])
    >>> [(e["pid"], e["ts"]) for e in merged["traceEvents"] if e["ph"] == "X"]
    [(0, 1250.0), (1, 1000.0)]
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

PHASE_TID = 0  # the track of ddpkit's step phases, in each rank's process
_KEPT = {"ddpkit"}  # never dropped by the cap
_FLOW_PHASES = {"s", "t", "f"}  # flow events: their ids must stay unique per rank


@dataclass(frozen=True)
class TraceOf:
    """One rank's trace and its clock's offset from rank 0's (ns; positive: ahead).

    Example:
        >>> TraceOf(1, "gpu7", {"traceEvents": []}, -1500).offset_us
        -1.5
    """

    rank: int
    host: str
    trace: dict[str, Any]
    offset_ns: int

    @property
    def offset_us(self) -> float:
        return self.offset_ns / 1000


def base_us(trace: dict[str, Any]) -> float:
    """The wall-clock time (µs since the epoch) that the trace's ``ts`` count from."""
    return _base_ns(trace) / 1000


def _base_ns(trace: dict[str, Any]) -> int:
    return int(trace.get("baseTimeNanoseconds", 0))


def phase_events(
    phases: Iterable[tuple[str, int, int, int]], pid: int, trace: dict[str, Any]
) -> list[dict[str, Any]]:
    """Chrome events for ddpkit's step phases ``(name, step, start_ns, end_ns)`` (wall clock),
    on their own track of the rank's process.

    Example:
        >>> phase_events([("data", 3, 2_000, 5_000)], 9, {})[1]["ts"]
        2.0
    """
    base = base_us(trace)
    name = {"ph": "M", "name": "thread_name", "pid": pid, "tid": PHASE_TID,
            "args": {"name": "ddpkit step phases"}}  # fmt: skip
    return [name] + [
        {"ph": "X", "cat": "ddpkit", "name": phase, "pid": pid, "tid": PHASE_TID,
         "ts": start / 1000 - base, "dur": (end - start) / 1000, "args": {"step": step}}
        for phase, step, start, end in phases
    ]  # fmt: skip


def shift(trace: dict[str, Any], by_us: float) -> None:
    """Move every event by ``by_us`` (a host clock that runs ahead, in tests)."""
    for event in trace.get("traceEvents", []):
        if "ts" in event:
            event["ts"] = float(event["ts"]) + by_us


def size_of(trace: dict[str, Any]) -> int:
    """The bytes of ``trace`` written as JSON (Python's default separators, as written)."""
    return len(json.dumps(trace))


def cap(trace: dict[str, Any], max_bytes: int) -> int:
    """Drop the shortest operator events until ``trace`` fits ``max_bytes``, their count
    (``ddpkit.dropped_events``) included; how many went.

    Example:
        >>> t = {"traceEvents": [{"ph": "X", "name": "x" * 50, "dur": d} for d in range(9)]}
        >>> cap(t, 400), [e["dur"] for e in t["traceEvents"]], t["ddpkit"]
        (5, [5, 6, 7, 8], {'dropped_events': 5})
    """
    total = 0
    while (excess := size_of(trace) - max_bytes) > 0:
        dropped = _drop_shortest(trace, excess)
        if not dropped:  # only what is never dropped is left
            break
        total += dropped
        trace.setdefault("ddpkit", {})["dropped_events"] = total
    return total


def _drop_shortest(trace: dict[str, Any], excess: int) -> int:
    """Drop the shortest droppable events whose JSON adds up to ``excess`` bytes."""
    events = trace["traceEvents"]
    droppable = sorted(
        (i for i, e in enumerate(events) if e.get("ph") == "X" and e.get("cat") not in _KEPT),
        key=lambda i: float(events[i].get("dur", 0)),
    )
    dropped: set[int] = set()
    for index in droppable:
        if excess <= 0:
            break
        excess -= len(json.dumps(events[index])) + 2  # and its ", "
        dropped.add(index)
    trace["traceEvents"] = [e for i, e in enumerate(events) if i not in dropped]
    return len(dropped)


def merge(traces: list[TraceOf]) -> dict[str, Any]:
    """One trace of every rank on the first one's clock: a process track per rank.

    The merged ``ts`` count from the earliest rank's base; each rank's events move by its base
    against that one, less its clock's offset.
    """
    ordered = sorted(traces, key=lambda t: t.rank)
    base_ns = min((_base_ns(t.trace) - t.offset_ns for t in ordered), default=0)
    events: list[dict[str, Any]] = []
    for each in ordered:
        events.extend(_track_names(each))
        move = (_base_ns(each.trace) - each.offset_ns - base_ns) / 1000
        events.extend(_moved(event, each.rank, move) for event in each.trace.get("traceEvents", [])
                      if not _is_process_metadata(event))  # fmt: skip
    return {
        "schemaVersion": 1,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": base_ns,
        "traceName": "ddpkit: every rank",
        "ddpkit": {"ranks": {str(t.rank): {"host": t.host, "clock_offset_us": t.offset_us,
                                           **t.trace.get("ddpkit", {})} for t in ordered}},
        "traceEvents": events,
    }  # fmt: skip


def _track_names(each: TraceOf) -> list[dict[str, Any]]:
    """The rank's process track: named with its rank and host, sorted by rank."""
    label = f"rank {each.rank} ({each.host})"
    return [
        {"ph": "M", "name": "process_name", "pid": each.rank, "tid": 0, "args": {"name": label}},
        {"ph": "M", "name": "process_sort_index", "pid": each.rank, "tid": 0,
         "args": {"sort_index": each.rank}},
    ]  # fmt: skip


def _moved(event: dict[str, Any], rank: int, move_us: float) -> dict[str, Any]:
    moved = {**event, "pid": rank}
    if "ts" in event:
        moved["ts"] = float(event["ts"]) + move_us
    if event.get("ph") in _FLOW_PHASES and "id" in event:
        moved["id"] = f"{rank}:{event['id']}"  # two ranks' flows must not join
    return moved


def _is_process_metadata(event: dict[str, Any]) -> bool:
    return event.get("ph") == "M" and str(event.get("name", "")).startswith("process_")
