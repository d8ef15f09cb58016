"""A `ddpkit run` job in the background, for tests that signal or kill its processes."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ddpkit.checkpoint import list_checkpoints
from helpers.launch_helpers import REPO, processes_running


class Job:
    """A `ddpkit run` in the background, in its own session, its output in files."""

    def __init__(self, args: list[str], folder: Path) -> None:
        self.folder = folder
        self.out, self.err = folder.with_suffix(".out"), folder.with_suffix(".err")
        with self.out.open("w") as out, self.err.open("w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ddpkit", *args], cwd=REPO, stdout=out, stderr=err,
                start_new_session=True,
            )  # fmt: skip

    def wait_for_checkpoint(self) -> None:
        wait_until(lambda: bool(list_checkpoints(self.folder)), 90, "a first checkpoint")

    def worker(self, rank: int) -> int:
        found = [pid for pid in processes_running(str(self.folder)) if rank_of(pid) == rank]
        assert found, f"no worker of rank {rank} is running"
        return found[0]

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        code = self.process.wait(timeout=timeout)
        return code, self.out.read_text(), self.err.read_text()


@contextlib.contextmanager
def killed_at_the_end(launchers: list[subprocess.Popen[str]]) -> Iterator[None]:
    """Launchers started in sessions of their own (and any put in the list meanwhile): each
    still running at the block's end, a failed wait's or not, is killed with its session."""
    try:
        yield
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(launcher.pid, signal.SIGKILL)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}")
        time.sleep(0.02)


def wait_for_no_processes(needle: str, timeout: float = 45) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := processes_running(needle)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def rank_of(pid: int) -> int | None:
    """A worker's rank: ``RANK`` in the environment it started with (a fresh worker), else
    the rank its command line names (a warm worker, forked before its rank was set)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return None
    found = [v for v in environ if v.startswith(b"RANK=")]
    named = re.search(r"\(ddpkit rank (\d+)\)$", cmdline.rstrip("\0"))
    return int(found[0][5:]) if found else int(named[1]) if named else None


def kill_9(job: subprocess.Popen[str], workers: list[int]) -> None:
    """SIGKILL to each worker, then to the launcher's process group. torch's launcher starts
    every worker in a session of its own: killing only the launcher's group would leave the
    workers their lifeline's SIGTERM, on which they complete their writes and stop cleanly."""
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os.killpg(job.pid, signal.SIGKILL)


def workers_of(launcher: int) -> list[int]:
    """The worker processes a ``ddpkit run`` started: its children with a rank, or, with warm
    workers, its forkserver's (a worker's own children are not looked at)."""
    found, parents = [], [launcher]
    while parents:
        for pid in children(parents.pop()):
            (found if rank_of(pid) is not None else parents).append(pid)
    return sorted(found)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc; Linux)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        if int(fields[1]) == pid:  # after the name: the state, then the parent's pid
            found.append(int(stat.parent.name))
    return found
