"""Every rank's step times and peak memory side by side, and what they say: who is slow, and why.

:class:`RankTimes` holds one row per rank (milliseconds per step by phase, see
:mod:`ddpkit.observe.steptime`, and the peak memory). Read from it:

- the **breakdown**, the mean over ranks per phase, for the epoch line and the logs;
- the **straggler**: a rank whose own work per step (data + compute + optimizer: the time it
  does not spend waiting for others in sync or 'other') is at least :data:`SLOWER` above the
  median of the other ranks, and :data:`MIN_EXCESS_MS` in absolute terms, named with the
  phase it loses the time in (the phases' means against the others'). The other ranks pay
  for it in their sync time, so their step time is the straggler's: a slow rank shows in its
  work, not in its step time. The work compared is that of each rank's quicker steps (the
  25th percentile): on any rank some steps lose the core to the system, other processes or
  the communication threads (on CPU), and a rank that is slow by nature is slow in those
  too. A rank slow only now and then shows in the phases' means (the breakdown), not here;
- **data-bound**: every rank spends at least :data:`DATA_SHARE` of its step waiting for data,
  and :data:`DATA_MIN_MS` (a wait shorter than a loader worker's hand-over is no fault);
- the **memory outlier**: a rank whose peak is :data:`MEMORY_RATIO` times the median of the
  others and at least :data:`MEMORY_MIN_MB` above it.

The thresholds were set from balanced runs (see docs/slow-jobs.md): on 2-worker CPU runs the
quicker steps' work of two balanced ranks differed by up to 35% (mostly under 10%), the
median step's by up to 77% and the mean by up to 51%, in 20 epochs; a rank sharing its core
with a busy process was mostly 70-190% slower.

Example:
    >>> rows = RankTimes.from_rows([[10, 1.0, 0.1, 0.5, 0.3, 0.05, 0.065, 2**28],
    ...                             [10, 1.0, 0.1, 0.9, 0.0, 0.05, 0.105, 2**28]], ["a", "a"])
    >>> print(rows.straggler().describe())  # doctest: +NORMALIZE_WHITESPACE
    rank 1 is 62% slower than the median rank: +40.0 ms per step computing (105.0 ms of work
    per step against 65.0 ms); the others wait for it in gradient sync
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ddpkit.observe.steptime import WORK, Phase, StepTimes

SLOWER = 0.5  # a straggler does this much more work per step than the median rank
MIN_EXCESS_MS = 2.0  # and at least this many milliseconds more
DATA_SHARE = 0.3  # data-bound: every rank waits for data this share of its step at least
# and this many milliseconds per step: a DataLoader worker adds 1.2-2 ms to each batch it hands
# over (benchmarks/loader_handoff.py), so a shorter wait is not one that workers would shorten
DATA_MIN_MS = 5.0
MEMORY_RATIO = 1.5
MEMORY_MIN_MB = 128.0
_DOING = {
    Phase.DATA: "waiting for data",
    Phase.COMPUTE: "computing",
    Phase.OPTIMIZER: "in the optimizer step",
}


def times_row(times: StepTimes, peak_bytes: int) -> list[float]:
    """A rank's row to share: steps, wall seconds, each timed phase's seconds, the own work of
    its quicker steps (seconds), peak bytes.

    Example:
        >>> times_row(StepTimes(2, 1.0, {Phase.DATA: 0.5}, 0.25), 100)
        [2.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.25, 100.0]
    """
    seconds = times.seconds
    timed = [seconds[phase] for phase in _TIMED]
    return [float(times.steps), times.wall_s, *timed, times.quick_work_s, float(peak_bytes)]


@dataclass(frozen=True)
class Straggler:
    """The rank that works longest per step, and the phase it loses the time in.

    Example:
        >>> Straggler(3, "b", Phase.DATA, 90.0, 50.0, 41.0).slower
        0.8
    """

    rank: int
    host: str | None
    phase: Phase
    work_ms: float
    median_ms: float
    phase_excess_ms: float

    @property
    def slower(self) -> float:
        """How much more work per step than the median of the other ranks (0.38: 38%)."""
        return self.work_ms / self.median_ms - 1 if self.median_ms > 0 else float("inf")

    def describe(self) -> str:
        """``rank 1 (host b) is 38% slower than the median rank: +41 ms per step ...``."""
        who = f"rank {self.rank}" + (f" (host {self.host})" if self.host else "")
        return (
            f"{who} is {self._how_much()} the median rank: "
            f"+{self.phase_excess_ms:.1f} ms per step {_DOING[self.phase]} "
            f"({self.work_ms:.1f} ms of work per step against {self.median_ms:.1f} ms); "
            "the others wait for it in gradient sync"
        )

    def _how_much(self) -> str:
        # A rank 10 times as slow or more reads better as a factor than as "121657% slower"
        # (a rank asleep in its loader beside tiny steps of work).
        if self.slower < 9:
            return f"{self.slower:.0%} slower than"
        return f"{self.slower + 1:,.0f} times as slow as"


@dataclass(frozen=True)
class RankTimes:
    """Every rank's milliseconds per step by phase and peak memory (MB), by rank.

    Example:
        >>> times = RankTimes.from_rows([[4, 0.4, 0.2, 0.1, 0, 0, 0.07, 2**20]], ["a"])
        >>> print(times.compact())  # doctest: +NORMALIZE_WHITESPACE
        100.0 ms/step: data 50.0, compute 25.0, sync 0.0, optimizer 0.0, other 25.0;
        peak memory 1 MB
    """

    ms: list[dict[Phase, float]]
    quick_work_ms: list[float]
    peak_mb: list[float]
    hosts: list[str]

    @classmethod
    def from_rows(cls, rows: list[list[float]], hosts: list[str]) -> RankTimes:
        """From every rank's :func:`times_row`."""
        per_step, quick, peaks = [], [], []
        for steps, wall, *timed, quick_s, peak in rows:
            seconds = StepTimes(int(steps), wall, dict(zip(_TIMED, timed, strict=True))).seconds
            per_step.append({p: s * 1000 / max(steps, 1) for p, s in seconds.items()})
            quick.append(quick_s * 1000)
            peaks.append(peak / 2**20)
        return cls(per_step, quick, peaks, hosts)

    def mean_ms(self, phase: Phase) -> float:
        """The mean over ranks of ``phase``'s milliseconds per step."""
        return statistics.fmean(rank[phase] for rank in self.ms)

    def work_ms(self) -> list[float]:
        """Each rank's own work (data + compute + optimizer) in its quicker steps (the 25th
        percentile), in ms: steps the system took the core away from make no straggler."""
        return self.quick_work_ms

    def compact(self) -> str:
        """``8.2 ms/step: data 5.1, compute 2.0, ...; peak memory 412 MB (rank 1)``."""
        return f"{self.per_step()}; peak memory {self._peak_text()}"

    def per_step(self) -> str:
        """``8.2 ms/step: data 5.1, compute 2.0, sync 0.8, optimizer 0.2, other 0.1``."""
        step = sum(self.mean_ms(phase) for phase in Phase)
        phases = ", ".join(f"{p.value} {self.mean_ms(p):.1f}" for p in Phase)
        return f"{step:.1f} ms/step: {phases}"

    def metrics(self) -> dict[str, float]:
        """The figures for the epoch's history and the experiment logs.

        Example:
            >>> sorted(RankTimes.from_rows([[1, 0.1, 0, 0, 0, 0, 0, 0]], ["a"]).metrics())[:3]
            ['mem/peak_mb', 'mem/peak_rank', 'time/compute_ms']
        """
        work = self.work_ms()
        figures = {f"time/{phase.value}_ms": self.mean_ms(phase) for phase in Phase}
        figures["time/step_ms"] = sum(self.mean_ms(phase) for phase in Phase)
        figures["time/work_ms_min"] = min(work)
        figures["time/work_ms_median"] = statistics.median(work)
        figures["time/work_ms_max"] = max(work)
        figures["time/slowest_rank"] = float(work.index(max(work)))
        figures["mem/peak_mb"] = max(self.peak_mb)
        figures["mem/peak_rank"] = float(self.peak_mb.index(max(self.peak_mb)))
        return figures

    def straggler(self) -> Straggler | None:
        """The rank that does :data:`SLOWER` more work per step than the others' median."""
        work = self.work_ms()
        if len(work) < 2:
            return None
        rank = work.index(max(work))
        others = [w for r, w in enumerate(work) if r != rank]
        median = statistics.median(others)
        if work[rank] - median < max(MIN_EXCESS_MS, SLOWER * median):
            return None
        excess = {p: self.ms[rank][p] - self._median_of_others(p, rank) for p in WORK}
        phase = max(excess, key=lambda p: excess[p])
        return Straggler(rank, self._host(rank), phase, work[rank], median, excess[phase])

    def data_share(self) -> float:
        """The smallest share of a step any rank spends waiting for data."""
        return min(rank[Phase.DATA] / max(sum(rank.values()), 1e-9) for rank in self.ms)

    def data_bound(self) -> bool:
        """Every rank waits for data :data:`DATA_SHARE` of its step or more."""
        least_ms = min(rank[Phase.DATA] for rank in self.ms)
        return self.data_share() >= DATA_SHARE and least_ms >= DATA_MIN_MS

    def memory_outlier(self) -> str | None:
        """``rank 1 peaks at 3200 MB, the median of the others 1100 MB`` (None: no outlier)."""
        if len(self.peak_mb) < 2:
            return None
        rank = self.peak_mb.index(max(self.peak_mb))
        median = statistics.median(m for r, m in enumerate(self.peak_mb) if r != rank)
        peak = self.peak_mb[rank]
        if peak < MEMORY_RATIO * median or peak - median < MEMORY_MIN_MB:
            return None
        who = f"rank {rank}" + (f" (host {self._host(rank)})" if self._host(rank) else "")
        return f"{who} peaks at {peak:.0f} MB of memory, the median of the others {median:.0f} MB"

    def _median_of_others(self, phase: Phase, rank: int) -> float:
        return statistics.median(ms[phase] for r, ms in enumerate(self.ms) if r != rank)

    def _host(self, rank: int) -> str | None:
        """The rank's host, named only when the job spans several."""
        return self.hosts[rank] if len(set(self.hosts)) > 1 else None

    def _peak_text(self) -> str:
        peak = max(self.peak_mb)
        where = f" (rank {self.peak_mb.index(peak)})" if len(self.peak_mb) > 1 else ""
        return f"{peak:.0f} MB{where}"


_TIMED = [phase for phase in Phase if phase is not Phase.OTHER]
