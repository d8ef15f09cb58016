"""What each rank did over a profiled window: the answer to "slow, doing what?".

Each profiled rank sums its own window (:func:`rank_profile`): milliseconds per step in each
phase of the step clock (data, compute, sync, optimizer, other, from the phase track), of
the compute how much ran in no torch operator (Python: a sleep, a data-dependent loop, a
host-side metric), the collectives' time (the backend's own events, gloo's thread or NCCL's
kernels), and its top operators by self time. Rank 0 puts the ranks side by side
(:func:`summary_text`), names the slow rank with the straggler report's own rule (the same
:class:`~ddpkit.observe.ranktimes.RankTimes`, fed the window), and writes ``summary.csv`` and,
with matplotlib, ``summary.png`` (a stacked bar per rank).

Example:
    >>> p = RankProfile(1, "a", 2, {"compute": 9.0}, 3.0, 1.0, [("aten::mm", 4.0)], 2.0)
    >>> p.row()["python_ms"], p.row()["top_operators"]
    (3.0, 'aten::mm 4.00')
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddpkit.observe.ranktimes import RankTimes, Straggler, times_row
from ddpkit.observe.steptime import WORK, Phase, StepTimes

COLLECTIVE_PREFIXES = ("gloo:", "nccl:")  # the backends' own record of each collective
_TIMED_CATEGORIES = {"cpu_op", "user_annotation", "kernel", "gpu_memcpy", "gpu_memset"}
TOP_OPERATORS = 5
_BAR_PARTS = ("data", "compute ops", "python", "sync", "optimizer", "other")


@dataclass(frozen=True)
class RankProfile:
    """One rank's window: ms per step by phase, of the compute the ms in no torch operator
    (``python_ms``), the collectives' ms, the top operators (name, self ms per step) and
    its quicker steps' own work (ms, the straggler report's measure)."""

    rank: int
    host: str
    steps: int
    phase_ms: dict[str, float]
    python_ms: float
    collectives_ms: float
    top_operators: list[tuple[str, float]]
    quick_work_ms: float
    python_calls: list[tuple[str, float]] = field(default_factory=list)  # with stacks only

    def row(self) -> dict[str, Any]:
        """The rank's row of ``summary.csv``."""
        phases = {f"{p.value}_ms": round(self.phase_ms.get(p.value, 0.0), 3) for p in Phase}
        return {
            "rank": self.rank, "host": self.host, "steps": self.steps,
            "step_ms": round(sum(self.phase_ms.values()), 3), **phases,
            "python_ms": round(self.python_ms, 3), "collectives_ms": round(self.collectives_ms, 3),
            "top_operators": "; ".join(f"{name} {ms:.2f}" for name, ms in self.top_operators),
        }  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankProfile:
        """From :meth:`to_json`'s plain data (sent to rank 0 through the store)."""
        top = [(str(name), float(ms)) for name, ms in data["top_operators"]]
        calls = [(str(name), float(ms)) for name, ms in data.get("python_calls", [])]
        return cls(**{**data, "top_operators": top, "python_calls": calls})


def rank_profile(
    rank: int, host: str, phases: Sequence[tuple[str, int, int, int]], events: list[dict[str, Any]],
    main_tid: int, base_us: float,
) -> RankProfile:  # fmt: skip
    """Sum this rank's window: its phase intervals ``(name, step, start_ns, end_ns)`` (wall
    clock), its trace events (µs from ``base_us``, the trace's wall-clock base) and the
    thread that ran the steps."""
    steps = max(1, len({step for _, step, _, _ in phases}))
    per_phase: dict[str, float] = {}
    for name, _, start, end in phases:
        per_phase[name] = per_phase.get(name, 0.0) + (end - start) / 1e6 / steps
    compute = [(s / 1000 - base_us, e / 1000 - base_us) for name, _, s, e in phases
               if name == Phase.COMPUTE.value]  # fmt: skip
    ops = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
           if e.get("cat") == "cpu_op" and e.get("tid") == main_tid]  # fmt: skip
    python_ms = max(0.0, _length(compute) - _covered(compute, ops)) / 1000 / steps

    def top(categories: set[str], thread: Any = None) -> list[tuple[str, float]]:
        mine = [e for e in events if thread is None or e.get("tid") == thread]
        ranked = sorted(self_times(mine, categories).items(), key=lambda item: -item[1])
        return [(name, us / 1000 / steps) for name, us in ranked[:TOP_OPERATORS]]

    return RankProfile(
        rank, host, steps, per_phase, python_ms, _collective_us(events) / 1000 / steps,
        top(_TIMED_CATEGORIES), _quick_work_ms(phases), top({"python_function"}, main_tid),
    )  # fmt: skip


def self_times(events: Iterable[dict[str, Any]], categories: set[str]) -> dict[str, float]:
    """The self time in µs of each event of ``categories`` (operators, annotations, kernels;
    or Python calls, recorded with stacks): its duration less that of the events of those
    categories directly inside it on the same thread. Python calls and record_function
    ranges overlap without nesting (a range opens inside ``__enter__``), so each kind is
    nested apart.

    Example:
        >>> outer = {"ph": "X", "cat": "cpu_op", "name": "a", "tid": 1, "ts": 0, "dur": 10}
        >>> inner = {"ph": "X", "cat": "cpu_op", "name": "b", "tid": 1, "ts": 2, "dur": 3}
        >>> self_times([outer, inner], {"cpu_op"})
        {'a': 7.0, 'b': 3.0}
    """
    by_thread: dict[Any, list[dict[str, Any]]] = {}
    for event in events:
        if event.get("ph") == "X" and event.get("cat") in categories:
            by_thread.setdefault((event.get("pid"), event.get("tid")), []).append(event)
    totals: dict[str, float] = {}
    for thread in by_thread.values():
        _add_self_times(thread, totals)
    return totals


def _add_self_times(thread: list[dict[str, Any]], totals: dict[str, float]) -> None:
    """One thread's events, nested by time: each adds its duration, less its children's."""
    open_ends: list[tuple[float, str]] = []  # the enclosing events' ends and names
    for event in sorted(thread, key=lambda e: (float(e["ts"]), -float(e.get("dur", 0)))):
        start, took = float(event["ts"]), float(event.get("dur", 0))
        while open_ends and open_ends[-1][0] <= start:
            open_ends.pop()
        name = _name(event)
        if not name.startswith("ProfilerStep"):
            totals[name] = totals.get(name, 0.0) + took
        if open_ends:  # the parent's self time loses this child's
            parent = open_ends[-1][1]
            totals[parent] = totals.get(parent, 0.0) - took
        open_ends.append((start + took, name))


def slow_rank(profiles: Sequence[RankProfile]) -> Straggler | None:
    """The rank the straggler report's rule names over this window, if any."""
    rows = []
    for p in profiles:
        seconds = {phase: p.phase_ms.get(phase.value, 0.0) * p.steps / 1000 for phase in Phase}
        wall = sum(seconds.values())
        timed = StepTimes(p.steps, wall, seconds, p.quick_work_ms / 1000)
        rows.append(times_row(timed, 0))
    times = RankTimes.from_rows(rows, [p.host for p in profiles])
    found = times.straggler()
    if found is None:
        return None
    return Straggler(profiles[found.rank].rank, found.host, found.phase, found.work_ms,
                     found.median_ms, found.phase_excess_ms)  # fmt: skip


def summary_text(profiles: Sequence[RankProfile], what: str) -> str:
    """The table rank 0 prints: a row per rank, ms per step, and the slow rank named."""
    head = (f"{'rank':>4}  {'host':<12} {'step':>8} {'data':>7} {'compute':>8} {'python':>7} "
            f"{'sync':>7} {'optim':>7} {'other':>7} {'collect':>8}  "
            "top operators (self ms/step)")  # fmt: skip
    lines = [f"profile of {what}, ms per step:", head]
    for p in profiles:
        r = p.row()
        lines.append(
            f"{p.rank:>4}  {p.host[:12]:<12} {r['step_ms']:>8.1f} {r['data_ms']:>7.1f} "
            f"{r['compute_ms']:>8.1f} {r['python_ms']:>7.1f} {r['sync_ms']:>7.1f} "
            f"{r['optimizer_ms']:>7.1f} {r['other_ms']:>7.1f} {r['collectives_ms']:>8.1f}  "
            f"{r['top_operators'][:70]}"
        )
    lines.append(_verdict(profiles))
    return "\n".join(lines)


def write_csv(path: Path, profiles: Sequence[RankProfile]) -> None:
    """``summary.csv``: :meth:`RankProfile.row` for each rank."""
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(profiles[0].row()))
        writer.writeheader()
        writer.writerows(p.row() for p in profiles)


def draw(path: Path, profiles: Sequence[RankProfile], what: str) -> str | None:
    """``summary.png``: a stacked bar of each rank's step; a message when matplotlib is
    missing (None when drawn)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return "summary.png skipped: matplotlib is not installed (pip install 'ddpkit[bench]')"
    figure, axes = plt.subplots(figsize=(max(6.0, 1.0 * len(profiles) + 4), 4))
    labels = [f"rank {p.rank}" for p in profiles]
    bottom = [0.0] * len(profiles)
    for part in _BAR_PARTS:
        heights = [_part_ms(p, part) for p in profiles]
        axes.bar(labels, heights, bottom=bottom, label=part)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    axes.set_ylabel("ms per step")
    axes.set_title(f"where each rank's step goes\n{what}", fontsize="medium")
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return None


def _verdict(profiles: Sequence[RankProfile]) -> str:
    slow = slow_rank(profiles)
    if slow is None:
        return "no rank is slower than the others by the straggler report's measure"
    line = f"slow: {slow.describe()}"
    mine = next(p for p in profiles if p.rank == slow.rank)
    if slow.phase is Phase.COMPUTE and mine.python_ms > 0.5 * slow.phase_excess_ms:
        line += (f"; {mine.python_ms:.1f} ms of its compute per step runs in no torch operator "
                 "(Python: a sleep, a loop, a host-side metric)")  # fmt: skip
        if mine.python_calls:
            calls = ", ".join(f"{name} {ms:.1f} ms" for name, ms in mine.python_calls[:3])
            line += f"; its Python calls by self time per step: {calls}"
        else:
            line += ": profile with stacks (--profile-stacks) to see where"
    return line


def _part_ms(p: RankProfile, part: str) -> float:
    if part == "compute ops":
        return max(0.0, p.phase_ms.get("compute", 0.0) - p.python_ms)
    if part == "python":
        return p.python_ms
    return p.phase_ms.get(part, 0.0)


def _quick_work_ms(phases: Sequence[tuple[str, int, int, int]]) -> float:
    """The 25th percentile of the steps' own work (data + compute + optimizer), in ms."""
    work_names = {phase.value for phase in WORK}
    per_step: dict[int, float] = {}
    for name, step, start, end in phases:
        if name in work_names:
            per_step[step] = per_step.get(step, 0.0) + (end - start) / 1e6
    done = sorted(per_step.values())
    return done[(len(done) - 1) // 4] if done else 0.0


def _collective_us(events: list[dict[str, Any]]) -> float:
    """The collectives' time: NCCL's kernels on a GPU, else the backend's own events."""
    kernels = [e for e in events if e.get("cat") == "kernel" and "nccl" in _name(e).lower()]
    if kernels:
        return sum(float(e.get("dur", 0)) for e in kernels)
    backend = [e for e in events if e.get("ph") == "X" and _name(e).startswith(COLLECTIVE_PREFIXES)]
    return sum(float(e.get("dur", 0)) for e in backend)


def _name(event: dict[str, Any]) -> str:
    return str(event.get("name", ""))


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _covered(within: list[tuple[float, float]], ops: list[tuple[float, float]]) -> float:
    """How much of the ``within`` intervals the union of ``ops`` covers (same unit)."""
    union: list[list[float]] = []
    for start, end in sorted(ops):
        if union and start <= union[-1][1]:
            union[-1][1] = max(union[-1][1], end)
        else:
            union.append([start, end])
    return sum(max(0.0, min(e, ue) - max(s, us)) for s, e in within for us, ue in union)
