"""Sharing the ranks' step times (one small all-gather) and saying what they show, on rank 0.

Every rank's :class:`~ddpkit.observe.steptime.StepClock` runs on its own; every
``window`` optimizer steps (when every rank is at the same step) and at each epoch's end, a
:class:`RankReport` gathers one row of 8 numbers per rank (steps, wall time, four
timed phases, the quicker steps' own work, peak memory). Rank 0 then shows the breakdown
(the bar, the epoch line, the logs) and says, through the ``ddpkit`` logger:

- a straggler, when one appears or changes (``rank 1 (host b) is 38% slower than the median
  rank: +41 ms per step waiting for data ...``), from the process's second sharing on (the
  first comes while the process warms up);
- a data-bound run, once, with the fix that fits its loader and this machine's cores;
- a rank whose memory peaks far above the others', once per rank.

Example:
    >>> import torch
    >>> facts = LoaderFacts.of(torch.utils.data.DataLoader(range(4)))
    >>> print(data_advice(facts, cores_per_rank=8, cuda=False))  # doctest: +ELLIPSIS
    the loader reads samples in the training process (num_workers=0): give it workers, ...
"""

from __future__ import annotations

import os
import socket

import torch

from ddpkit._core.log import logger
from ddpkit._core.system import cpu_quota, usable_cores
from ddpkit.data.epochs import LoaderFacts
from ddpkit.observe.ranktimes import RankTimes, times_row
from ddpkit.observe.steptime import StepClock
from ddpkit.runtime.collectives import all_gather_same, is_main
from ddpkit.runtime.memory import peak_memory_bytes, reset_peak_memory
from ddpkit.runtime.session import current_world

HOST_BYTES = 64  # host names are shared as this many bytes (longer ones are cut)
# A process's first shared times are not judged for a straggler: its first steps run while it
# warms up (lazy initialisation, first allocations, caches), unevenly across ranks (balanced
# 2-worker CPU runs showed a rank up to 75% slower there, and not after).
_warm = False


class RankReport:
    """Rank 0's view of every rank's step times, and what it has said of them.

    Example::

        report = RankReport(clock)
        metrics, _ = report.epoch_end(loader)   # a collective: every rank calls it
    """

    def __init__(self, clock: StepClock) -> None:
        self.clock = clock
        self.world = current_world()
        self.latest: RankTimes | None = None
        self.asked = False  # a rank asked for a profile at the last sharing
        self._hosts: list[str] | None = None
        self._said_straggler: tuple[int, str] | None = None
        self._said_data_bound = False
        self._said_memory: set[str] = set()

    def epoch_started(self) -> None:
        """A new epoch: the clock and the memory peak start afresh."""
        self.clock.restart()
        reset_peak_memory(self.world.device)

    def share_carrying(
        self, loader: LoaderFacts | None, carry: torch.Tensor | None, asks: bool = False
    ) -> tuple[RankTimes | None, torch.Tensor | None]:
        """Every rank's times so far this epoch (a collective; None when the clock is off);
        rank 0 says what they show of the epoch training on ``loader``. ``asks``: this rank
        asks for a profile; :attr:`asked` is then whether any rank did. The same all-gather
        carries ``carry`` (a row of float64 numbers, the same length on every rank): every
        rank's, by rank, come back with the times. One collective where two would be (0.3-1
        ms each on gloo)."""
        if not self.clock.enabled:
            return None, (all_gather_same(carry.cpu()) if carry is not None else None)
        own = [*times_row(self.clock.totals(), peak_memory_bytes(self.world.device)), float(asks)]
        extra = carry.cpu() if carry is not None else torch.zeros(0, dtype=torch.float64)
        gathered = all_gather_same(torch.cat([torch.tensor(own, dtype=torch.float64), extra]))
        carried = gathered[:, len(own) :] if carry is not None else None
        return self._take(gathered[:, : len(own)].tolist(), loader), carried

    def _take(self, rows: list[list[float]], loader: LoaderFacts | None) -> RankTimes:
        """Every rank's shared row (its times, then whether it asks for a profile)."""
        global _warm
        self.asked = any(shared[-1] for shared in rows)
        self.latest = RankTimes.from_rows([shared[:-1] for shared in rows], self._gather_hosts())
        if is_main():
            self._say(self.latest, loader, judge_ranks=_warm)
        _warm = True
        return self.latest

    def epoch_end(
        self, loader: LoaderFacts | None, carry: torch.Tensor | None = None
    ) -> tuple[dict[str, float], torch.Tensor | None]:
        """Share the epoch's times (carrying ``carry``, see :meth:`share_carrying`), say what
        they show (rank 0); return the figures and the carried rows."""
        times, carried = self.share_carrying(loader, carry)
        return ({} if times is None else times.metrics()), carried

    def _say(self, times: RankTimes, loader: LoaderFacts | None, judge_ranks: bool) -> None:
        straggler = times.straggler() if judge_ranks else None
        if straggler is not None:
            key = (straggler.rank, straggler.phase.value)
            if key != self._said_straggler:
                logger.warning(f"straggler: {straggler.describe()}{self._oversubscribed()}")
            self._said_straggler = key
        if times.data_bound() and not self._said_data_bound:
            self._said_data_bound = True
            share = times.data_share()
            cores = max(1, usable_cores() // max(1, self.world.local_world_size))
            advice = data_advice(loader, cores, self.world.device.type == "cuda")
            logger.warning(f"data-bound: every rank waits for data {share:.0%} of its step "
                           f"or more; {advice}")  # fmt: skip
        outlier = times.memory_outlier()
        if outlier is not None:
            who = outlier.split(" peaks")[0]  # said once per rank, whatever its peak
            if who not in self._said_memory:
                logger.warning(f"memory: {outlier}")
            self._said_memory.add(who)

    def _oversubscribed(self) -> str:
        """What the straggler line adds where this host's CPU ranks outnumber its cores:
        they take turns on them, unevenly, and one rank can lag by that alone."""
        cores, ranks = launch_cores(), self.world.local_world_size
        if self.world.device.type != "cpu" or ranks <= cores:
            return ""
        return (f"; but this host runs {ranks} CPU ranks on {cores} cores, which they take "
                "turns on: a rank can lag by that alone")  # fmt: skip

    def _gather_hosts(self) -> list[str]:
        if self._hosts is None:  # once per run: host names do not change
            name = socket.gethostname().encode()[:HOST_BYTES].ljust(HOST_BYTES, b"\0")
            rows = all_gather_same(torch.tensor(list(name), dtype=torch.uint8))
            self._hosts = [bytes(row.tolist()).rstrip(b"\0").decode(errors="replace")
                           for row in rows]  # fmt: skip
        return self._hosts


def launch_cores() -> int:
    """The cores this node's ranks were started on: the launcher's (a rank pinned to a core
    of its own sees one), less where the cgroup's CPU quota is smaller.

    Example:
        >>> launch_cores() >= 1
        True
    """
    own = usable_cores()
    try:
        started = len(os.sched_getaffinity(os.getppid()))
    except (AttributeError, OSError):  # not on Linux; the parent is gone
        return own
    quota = cpu_quota()
    return max(own, min(started, quota) if quota is not None else started)


def data_advice(loader: LoaderFacts | None, cores_per_rank: int, cuda: bool) -> str:
    """What would feed the steps faster, given the loader's settings and the cores per rank.

    Example:
        >>> loader = LoaderFacts(workers=4, persistent_workers=True, pin_memory=True,
        ...                      prefetch_factor=2, ranks_in_step=False, generator_state=None)
        >>> print(data_advice(loader, cores_per_rank=4, cuda=True))  # doctest: +ELLIPSIS
        the loader's 4 workers use this machine's 4 cores per rank already: make each ...
    """
    workers = loader.workers if loader is not None else None
    if loader is None or workers is None:
        return ("the loader is not a DataLoader: load batches ahead of the step (a DataLoader "
                "with num_workers) or make each sample cheaper to load")  # fmt: skip
    extras = []
    if not loader.persistent_workers:
        extras.append("persistent_workers=True")
    if cuda and not loader.pin_memory:
        extras.append("pin_memory=True")
    tail = f", with {' and '.join(extras)}" if extras else ""
    suggest = max(1, cores_per_rank - 1)  # one core stays with the training process
    if workers == 0:
        crowded = ", which they share with training" if cores_per_rank < 2 else ""
        return (f"the loader reads samples in the training process (num_workers=0): give it "
                f"workers, e.g. num_workers={suggest} (this machine has "
                f"{_cores(cores_per_rank)} per rank{crowded}){tail}")  # fmt: skip
    if workers < suggest:
        return (f"raise the loader's num_workers from {workers} (this machine has "
                f"{_cores(cores_per_rank)} per rank){tail}")  # fmt: skip
    return (f"the loader's {workers} workers use this machine's {_cores(cores_per_rank)} per rank "
            "already: make each sample cheaper to load (decode or augment less, cache "
            f"preprocessed samples), or raise prefetch_factor (now {loader.prefetch_factor}) "
            f"when loading times vary{tail}")  # fmt: skip


def _cores(count: int) -> str:
    return f"{count} core{'s' if count != 1 else ''}"
