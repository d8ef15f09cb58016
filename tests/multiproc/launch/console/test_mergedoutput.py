"""The merged console of ``ddpkit run`` on real workers: a 4-worker job in which every rank
prints the same warning and a line of its own, and rank 1 then fails
(tests/scripts/same_warning.py); and 2-worker jobs whose rank 0 draws a progress bar and
writes to stdout and stderr in turn (tests/scripts/live_output.py), followed through a pipe
and through a terminal."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.launch_helpers import REPO, SCRIPTS

pytestmark = [pytest.mark.multiproc, pytest.mark.serial]  # timed: merges lines by arrival time
WARNING = "UserWarning: the old API is deprecated; use the new one"


@pytest.fixture(scope="module")
def failed_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[tuple[float, str]], Path]:
    """(arrival time, line) of everything the launcher printed, and its --log-dir."""
    logs = tmp_path_factory.mktemp("console") / "logs"
    command = [sys.executable, "-m", "ddpkit", "run", "--nproc", "4", "--log-dir", str(logs),
               str(SCRIPTS / "same_warning.py"), "fail"]  # fmt: skip
    job = subprocess.Popen(command, cwd=REPO, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)  # fmt: skip
    assert job.stdout is not None
    arrived = [(time.time(), line.rstrip("\n")) for line in job.stdout]
    assert job.wait(timeout=120) == 1, arrived
    return arrived, logs


def test_the_same_warning_of_four_ranks_is_one_line_and_the_others_keep_their_rank(
    failed_job: tuple[list[tuple[float, str]], Path],
) -> None:
    lines = [line for _, line in failed_job[0]]
    assert [line for line in lines if WARNING in line] == [f"[ranks 0-3] {_where()}{WARNING}"]
    for rank in range(4):
        assert lines.count(f"[rank{rank}] rank {rank} holds shard {rank}") == 1, lines
    ones = [line for line in lines if line.startswith("[rank1] ")]
    assert ones[0].endswith("holds shard 1") and "fails at" in ones[1], ones  # its own order


def test_the_log_dir_keeps_every_ranks_whole_output_in_the_order_written(
    failed_job: tuple[list[tuple[float, str]], Path],
) -> None:
    for rank in range(4):
        [out] = failed_job[1].glob(f"*/attempt_0/{rank}/stdout.log")
        text = out.read_text()  # stderr joined stdout's file: one order for both
        assert text.index(WARNING) < text.index(f"rank {rank} holds shard {rank}"), text


def test_the_failure_report_follows_the_failure_without_waiting(
    failed_job: tuple[list[tuple[float, str]], Path],
) -> None:
    arrived = failed_job[0]
    texts = [line for _, line in arrived]
    failed_at = float(re.search(r"fails at ([\d.]+)", "\n".join(texts))[1])  # type: ignore[index]
    report = next(i for i, line in enumerate(texts) if "worker rank 1 failed" in line)
    # torch's agent notices the exit within its monitor interval and stops the other ranks;
    # the console adds no wait (its window is 0.5 s), and every worker line is out first.
    assert arrived[report][0] - failed_at < 5, arrived[report][0] - failed_at
    assert not [line for line in texts[report:] if line.startswith("[rank")], texts


def _where() -> str:
    return f"{SCRIPTS / 'same_warning.py'}:12: "


def live_job(mode: str, terminal: bool) -> tuple[list[tuple[float, str]], str]:
    """(arrival time, text) of each state or line the launcher wrote to its stdout, split at
    ``\\r`` and ``\\n`` as they arrived (a bar's states end in no newline), and its stderr;
    the stdout is a pipe, or a terminal (a pseudo-terminal the test reads)."""
    reader, writer = pty.openpty() if terminal else os.pipe()
    command = [sys.executable, "-m", "ddpkit", "run", "--nproc", "2",
               str(SCRIPTS / "live_output.py"), mode]  # fmt: skip
    job = subprocess.Popen(command, cwd=REPO, stdout=writer, stderr=subprocess.PIPE)
    os.close(writer)
    arrived: list[tuple[float, str]] = []
    partial = ""
    while chunk := _read(reader):
        *parts, partial = re.split(r"[\r\n]", partial + chunk.decode(errors="replace"))
        arrived += [(time.time(), part) for part in parts if part.strip()]
    os.close(reader)
    assert job.wait(timeout=120) == 0, (arrived, job.stderr.read())  # type: ignore[union-attr]
    return arrived, job.stderr.read().decode()  # type: ignore[union-attr]


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # a pseudo-terminal whose other end closed
        return b""


@pytest.fixture(scope="module")
def piped_user_bar() -> tuple[list[tuple[float, str]], str]:
    return live_job("user", terminal=False)


def test_a_ranks_own_bar_goes_out_live_through_a_pipe(
    piped_user_bar: tuple[list[tuple[float, str]], str],
) -> None:
    _assert_live_bar(piped_user_bar[0], "[rank0] user bar:")


def test_a_ranks_stdout_and_stderr_keep_the_order_it_wrote_them_in(
    piped_user_bar: tuple[list[tuple[float, str]], str],
) -> None:
    lines = [text for _, text in piped_user_bar[0]]
    assert [line for line in lines if "ORDER" in line] == [
        "[rank0] ORDER A", "[rank0] ORDER B", "[rank0] ORDER C",
    ], lines  # fmt: skip
    # rank 0 logged its start-up line before the warning every rank printed after it
    started = next(i for i, line in enumerate(lines) if "ddpkit: world size 2" in line)
    warned = next(i for i, line in enumerate(lines) if "every rank warns after init" in line)
    assert started < warned and lines[warned].startswith("[ranks 0-1] "), lines
    done = next(i for i, line in enumerate(lines) if "BAR DONE" in line)
    assert "16/16" in lines[done - 1], lines  # the finished bar, then the line after it


@pytest.fixture(scope="module")
def terminal_trainer_bar() -> tuple[list[tuple[float, str]], str]:
    return live_job("trainer", terminal=True)


def test_ddpkits_own_bar_goes_out_live_in_a_terminal(
    terminal_trainer_bar: tuple[list[tuple[float, str]], str],
) -> None:
    arrived = terminal_trainer_bar[0]
    _assert_live_bar(arrived, "\x1b[K[rank0] epoch 1/1:")  # redrawn in place
    texts = [text for _, text in arrived]
    assert any(text.startswith("\x1b[K[rank0] epoch 1/1  loss") for text in texts), texts


def _assert_live_bar(arrived: list[tuple[float, str]], bar: str) -> None:
    """Intermediate states of a 4-second bar (16 steps of 0.25 s) reached the launcher's
    output while the bar still ran: a state between a quarter and a half of it at least a
    second before the bar was done, one between a half and three quarters at least half a
    second before. A state is written 1.75 s (or more) and 1 s (or more) before then; the
    console shows it within 0.8 s (measured: a poll of 50 ms to find it whole, at most two
    states a second in a pipe); a console that printed the bar at its end fails."""
    done_at = float(next(t.split()[-1] for _, t in arrived if "BAR DONE" in t))
    pattern = re.escape(bar) + r"\s+(\d+)%"
    percents = {int(m[1]): at for at, t in arrived if (m := re.match(pattern, t))}
    ahead = {p: round(done_at - at, 2) for p, at in percents.items()}
    assert any(25 <= p < 50 and s >= 1.0 for p, s in ahead.items()), ahead
    assert any(50 <= p < 75 and s >= 0.5 for p, s in ahead.items()), ahead
