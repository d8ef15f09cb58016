"""One readable console for N workers: identical lines printed once, with their ranks, and
a line still being drawn (a progress bar) shown live.

``ddpkit run`` has torch's agent write each worker's output to files (the ``--log-dir``
folder when given: every rank's whole output stays there) and follows the files from a
thread of the launcher. A worker started through ddpkit's bootstrap writes its stderr into
its stdout file (:data:`~ddpkit._core.protocol.ONE_STREAM_ENV`), so the file keeps the order
in which the rank wrote to the two, and the console prints them in that order, on its
stdout. :mod:`~ddpkit.launch.console.linemerge` decides which lines become one and when each goes
out; :mod:`~ddpkit.launch.console.liveline` draws the line a rank is redrawing with ``\\r``. When
the workers stop, everything left is printed at once, before the launcher's report, so a
failure is never held back.

Example:
    >>> import io, tempfile
    >>> folder, out = Path(tempfile.mkdtemp()), io.StringIO()
    >>> with MergedConsole(window=0.5, ranks=2, out=out) as console:
    ...     for rank in (0, 1):
    ...         console.follow(rank, "out", folder / f"{rank}.log")
    ...         _ = (folder / f"{rank}.log").write_text("UserWarning: old API\\n")
    >>> out.getvalue()
    '[ranks 0-1] UserWarning: old API\\n'
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.api import LogsDest

from ddpkit.launch.console.linemerge import Group, LineMerger, labelled
from ddpkit.launch.console.liveline import LiveLine

POLL_S = 0.05  # how often the files are read


class FollowedFile:
    """A worker's output file, read as it grows: its whole lines (a line is whole once its
    newline came) and ``live``, the newest state of the line it is still drawing.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "stdout.log"
        >>> _ = path.write_text("start\\n\\r 10%|#\\r 20%|##\\r 3")
        >>> followed = FollowedFile(path)
        >>> followed.new_lines(), followed.live
        (['start'], ' 20%|##')
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.live: str | None = None  # None: no line in progress
        self._file: IO[str] | None = None
        self._partial = ""

    def new_lines(self, final: bool = False) -> list[str]:
        """The lines completed since the last call (with ``final``, an unfinished last line
        too: the worker is done); each as last drawn, where it was redrawn with ``\\r``."""
        if self._file is None:
            try:
                self._file = self.path.open(encoding="utf-8", errors="replace", newline="")
            except FileNotFoundError:
                return []
        before = self._partial
        text = before + self._file.read()
        *lines, self._partial = text.split("\n")
        if final and self._partial:
            lines, self._partial = [*lines, self._partial], ""
        self._follow_live(stable=not lines and self._partial == before)
        return [line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines]

    def _follow_live(self, stable: bool) -> None:
        """The unfinished line's newest state: a part a ``\\r`` closed is complete; the
        part after the last ``\\r`` only once a poll found it unchanged (it may be half
        written). A state of blanks is a cleared line (tqdm's ``leave=False``)."""
        if not self._partial:
            self.live = None
            return
        *closed, last = self._partial.split("\r")
        states = [part for part in [*closed, *([last] if stable else [])] if part]
        if states:
            self.live = states[-1].rstrip()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class MergedConsole:
    """Follows every worker's output files and prints them merged, from a thread; the line
    a rank is drawing goes out live (:class:`~ddpkit.launch.console.liveline.LiveLine`).

    Example::

        console = MergedConsole(window=0.5, ranks=4)
        with console:
            elastic_launch(config_with(MergedLogsSpecs(log_dir, console)), ...)(...)
    """

    def __init__(self, window: float, ranks: int, out: Any = None, err: Any = None) -> None:
        self.merger = LineMerger(window, ranks)
        self._streams = {"out": out or sys.stdout, "err": err or sys.stderr}
        self.live = LiveLine.on(self._streams["out"])
        self._files: dict[tuple[int, str], FollowedFile] = {}
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
            self._files[(rank, stream)] = FollowedFile(path)

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
        """Read every file's new lines, print what is due (everything when ``final``), then
        show the line in progress."""
        with self._lock:
            for (rank, stream), followed in self._files.items():
                self._take(rank, stream, followed.new_lines(final=final))
            now = time.monotonic()
            self._print(self.merger.ready(now, flush=final))
            if final:
                self.live.clear()  # an unfinished line was printed whole above
            else:
                self.live.show(self._live_text(), now)

    def _take(self, rank: int, stream: str, lines: list[str]) -> None:
        now = time.monotonic()
        for line in lines:
            self.merger.add(rank, stream, line, now)

    def _live_text(self) -> str:
        """The lowest rank's line in progress, unless a line it wrote before still waits to
        be printed (what a rank draws never overtakes what it printed)."""
        for (rank, stream), followed in sorted(self._files.items()):
            if followed.live and not self.merger.holds(rank, stream):
                return labelled([rank], followed.live)
        return ""

    def _print(self, groups: list[Group]) -> None:
        if not groups:
            return
        self.live.clear()
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
