"""One readable console for N workers: identical lines printed once, with their ranks.

``ddpkit run`` has torch's agent write each worker's stdout and stderr to files (the
``--log-dir`` folder when given: every rank's whole output stays there) and follows the
files from a thread of the launcher. A line that several ranks print within ``window``
seconds is printed once, ``[ranks 0-3] UserWarning: ...``; a line of one rank keeps its
``[rank1]`` prefix. A rank's own lines keep their order: a line waits behind that rank's
earlier lines. A line printed by every local rank goes out at once; others wait at most
``window`` seconds for their twins. (A rank's stdout and stderr are two files: the order
between them is not known, as with torchrun's ``--tee``.) When the workers stop, everything
left is printed at once, before the launcher's report, so a failure is never held back.

Example:
    >>> merger = LineMerger(window=0.5, ranks=2)
    >>> merger.add(0, "err", "UserWarning: old API", now=0.0)
    >>> merger.add(1, "err", "UserWarning: old API", now=0.1)
    >>> merger.add(1, "out", "rank 1 is here", now=0.1)
    >>> [group.line() for group in merger.ready(now=0.2)]
    ['[ranks 0-1] UserWarning: old API']
    >>> [group.line() for group in merger.ready(now=0.7)]
    ['[rank1] rank 1 is here']
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.api import LogsDest

POLL_S = 0.05  # how often the files are read


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
        if len(self.ranks) == 1:
            return f"[rank{self.ranks[0]}] {self.text}"
        return f"[ranks {rank_ranges(self.ranks)}] {self.text}"


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


class _FollowedFile:
    """A worker's output file, read as it grows; a line is whole once its newline came."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None
        self._partial = ""

    def new_lines(self, final: bool = False) -> list[str]:
        if self._file is None:
            try:
                self._file = self.path.open(encoding="utf-8", errors="replace", newline="")
            except FileNotFoundError:
                return []
        text = self._partial + self._file.read()
        *lines, self._partial = text.split("\n")
        if final and self._partial:
            lines, self._partial = [*lines, self._partial], ""
        return [line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines]  # a redrawn line

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class MergedConsole:
    """Follows every worker's stdout and stderr file and prints them merged, from a thread.

    Example::

        console = MergedConsole(window=0.5, ranks=4)
        with console:
            elastic_launch(config_with(MergedLogsSpecs(log_dir, console)), ...)(...)
    """

    def __init__(self, window: float, ranks: int, out: Any = None, err: Any = None) -> None:
        self.merger = LineMerger(window, ranks)
        self._streams = {"out": out or sys.stdout, "err": err or sys.stderr}
        self._files: dict[tuple[int, str], _FollowedFile] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="ddpkit-console", daemon=True)

    def follow(self, rank: int, stream: str, path: Path) -> None:
        """Read ``path`` as ``rank``'s ``stream`` from now on (a restart's new file replaces
        the previous attempt's, which is read to its end first)."""
        with self._lock:
            old = self._files.get((rank, stream))
            if old is not None:
                self._take(rank, stream, old.new_lines(final=True))
                old.close()
            self._files[(rank, stream)] = _FollowedFile(path)

    def __enter__(self) -> MergedConsole:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Read what is left and print everything at once: the workers are done."""
        self._stop.set()
        self._thread.join()
        self._poll(final=True)
        for followed in self._files.values():
            followed.close()

    def _follow(self) -> None:
        while not self._stop.wait(POLL_S):
            self._poll(final=False)

    def _poll(self, final: bool) -> None:
        """Read every file's new lines and print what is due (everything when ``final``)."""
        with self._lock:
            for (rank, stream), followed in self._files.items():
                self._take(rank, stream, followed.new_lines(final=final))
            self._print(self.merger.ready(time.monotonic(), flush=final))

    def _take(self, rank: int, stream: str, lines: list[str]) -> None:
        now = time.monotonic()
        for line in lines:
            self.merger.add(rank, stream, line, now)

    def _print(self, groups: list[Group]) -> None:
        for group in groups:
            self._streams[group.stream].write(group.line() + "\n")
        for stream in {group.stream for group in groups}:
            self._streams[stream].flush()


class MergedLogsSpecs(DefaultLogsSpecs):
    """torch's log files per worker (in ``log_dir``), each followed by ``console``.

    Example::

        LaunchConfig(..., logs_specs=MergedLogsSpecs(log_dir, console))
    """

    def __init__(self, log_dir: str, console: MergedConsole) -> None:
        super().__init__(log_dir=log_dir, redirects=Std.ALL, tee=Std.NONE)
        self.console = console

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        destinations = super().reify(envs)
        for local_rank, env in envs.items():
            rank = int(env.get("RANK", local_rank))
            self.console.follow(rank, "out", Path(destinations.stdouts[local_rank]))
            self.console.follow(rank, "err", Path(destinations.stderrs[local_rank]))
        return destinations
