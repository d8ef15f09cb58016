"""Which of N workers' lines to print as one, and when: the merging, without files or threads.

A line that several ranks print within ``window`` seconds is printed once,
``[ranks 0-3] UserWarning: ...``; a line of one rank keeps its ``[rank1]`` prefix. A rank's
own lines keep their order: a line waits behind that rank's earlier lines. A line printed by
every rank goes out at once; others wait at most ``window`` seconds for their twins.

Example:
    >>> merger = LineMerger(window=0.5, ranks=2)
    >>> merger.add(0, "out", "UserWarning: old API", now=0.0)
    >>> merger.add(1, "out", "UserWarning: old API", now=0.1)
    >>> merger.add(1, "out", "rank 1 is here", now=0.1)
    >>> [group.line() for group in merger.ready(now=0.2)]
    ['[ranks 0-1] UserWarning: old API']
    >>> [group.line() for group in merger.ready(now=0.7)]
    ['[rank1] rank 1 is here']
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)  # compared by identity: two groups may hold the same line
class Group:
    """One line and the ranks that printed it, in the order it arrived."""

    seq: int
    stream: str  # "out" or "err"
    text: str
    since: float
    ranks: list[int] = field(default_factory=list)
    printed: bool = False

    def line(self) -> str:
        """The line as shown: ``[rank2] text`` or ``[ranks 0-3,5] text``."""
        return labelled(self.ranks, self.text)


class LineMerger:
    """Which lines to print, and when: the merging, without files or threads.

    Example:
        >>> merger = LineMerger(window=1.0, ranks=2)
        >>> merger.add(0, "out", "loss 0.5", now=0.0)
        >>> merger.ready(now=0.5), [g.line() for g in merger.ready(now=0.0, flush=True)]
        ([], ['[rank0] loss 0.5'])
    """

    def __init__(self, window: float, ranks: int) -> None:
        self.window, self.ranks = window, ranks
        self._pending: list[Group] = []
        self._joinable: dict[tuple[str, str], Group] = {}
        self._last: dict[tuple[int, str], int] = {}  # (rank, stream) -> seq of its newest line
        self._seq = 0

    def add(self, rank: int, stream: str, text: str, now: float) -> None:
        """``rank`` printed ``text`` on ``stream`` at ``now``."""
        group = self._joinable.get((stream, text))
        if group is None or not self._can_join(group, rank, now):
            self._seq += 1
            group = Group(self._seq, stream, text, now)
            self._pending.append(group)
            self._joinable[(stream, text)] = group
        group.ranks.append(rank)
        self._last[(rank, stream)] = group.seq

    def _can_join(self, group: Group, rank: int, now: float) -> bool:
        # Joining a group older than the rank's newest line would print its lines out of order.
        fresh = now - group.since < self.window and not group.printed
        newer = group.seq > self._last.get((rank, group.stream), 0)
        return fresh and rank not in group.ranks and newer

    def holds(self, rank: int, stream: str) -> bool:
        """Whether a line of ``rank`` on ``stream`` waits to be printed (what the rank draws
        next must wait behind it)."""
        return any(rank in group.ranks and group.stream == stream for group in self._pending)

    def ready(self, now: float, flush: bool = False) -> list[Group]:
        """The groups to print now (all of them with ``flush``), in order."""
        out: list[Group] = []
        held: list[Group] = []
        waiting: set[tuple[int, str]] = set()  # (rank, stream) with an earlier line held
        for group in self._pending:
            due = flush or len(group.ranks) >= self.ranks or now - group.since >= self.window
            sources = {(rank, group.stream) for rank in group.ranks}
            if due and not waiting & sources:
                group.printed = True
                out.append(group)
                if self._joinable.get((group.stream, group.text)) is group:
                    del self._joinable[(group.stream, group.text)]  # a long job's lines go
            else:
                waiting |= sources
                held.append(group)
        self._pending = held
        return out


def labelled(ranks: list[int], text: str) -> str:
    """``text`` as the console shows it for ``ranks``.

    Example:
        >>> labelled([1], "loss 0.5"), labelled([0, 1, 2], "UserWarning: x")
        ('[rank1] loss 0.5', '[ranks 0-2] UserWarning: x')
    """
    if len(ranks) == 1:
        return f"[rank{ranks[0]}] {text}"
    return f"[ranks {rank_ranges(ranks)}] {text}"


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 3, 5]`` -> ``"0-3,5"``.

    Example:
        >>> rank_ranges([3, 0, 1, 2, 5, 7, 8])
        '0-3,5,7-8'
    """
    parts: list[str] = []
    ordered = sorted(set(ranks))
    start = previous = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return ",".join(parts)
