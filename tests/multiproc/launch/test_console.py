"""The merged console of ``ddpkit run``, on 4 real workers (tests/scripts/same_warning.py):
one job, in which every rank prints the same warning and a line of its own, and rank 1
then fails."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.launch_helpers import REPO, SCRIPTS

pytestmark = pytest.mark.multiproc
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


def test_the_log_dir_keeps_every_ranks_whole_output(
    failed_job: tuple[list[tuple[float, str]], Path],
) -> None:
    for rank in range(4):
        [out] = failed_job[1].glob(f"*/attempt_0/{rank}/stdout.log")
        [err] = failed_job[1].glob(f"*/attempt_0/{rank}/stderr.log")
        assert f"rank {rank} holds shard {rank}" in out.read_text()
        assert WARNING in err.read_text()


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
