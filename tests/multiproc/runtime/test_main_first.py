"""`ddpkit.main_first()` for real: a long block on rank 0 is waited for without a timeout, a
rank 0 stopped inside it is named with the block's line within the hang timeout + 10 s."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.jobs import rank_of
from helpers.launch_helpers import REPO, SCRIPTS, processes_running

pytestmark = pytest.mark.multiproc

HANG_TIMEOUT_S = 3
SCRIPT = SCRIPTS / "main_first.py"
LINE = next(  # the `with ddpkit.main_first():` line
    n for n, text in enumerate(SCRIPT.read_text().splitlines(), 1) if text.startswith("with ")
)


def launch(mode: str, out: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "--hang-timeout",
               str(HANG_TIMEOUT_S), str(SCRIPT), mode, str(out)]  # fmt: skip
    return subprocess.Popen(command, cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


@pytest.mark.timeout(120)
def test_rank0_three_hang_timeouts_inside_the_block_and_the_job_finishes(tmp_path: Path) -> None:
    started = time.monotonic()
    job = launch("slow", tmp_path)
    output, _ = job.communicate(timeout=100)
    assert job.returncode == 0, output
    assert "rank 0 read tokenized" in output and "rank 1 read tokenized" in output, output
    assert time.monotonic() - started > 3 * HANG_TIMEOUT_S  # rank 1 really waited that long


@pytest.mark.timeout(150)
def test_a_rank0_stopped_inside_the_block_is_named_with_its_line(tmp_path: Path) -> None:
    job, lines = launch("stop", tmp_path), []
    assert job.stdout is not None

    def read() -> None:
        for line in job.stdout:  # type: ignore[union-attr]
            lines.append((time.time(), line))
            if "stopped inside main_first()" in line:  # named: end the stopped rank 0 now,
                _kill_rank0(tmp_path)  # not after torch's 30 s of waiting for it to stop

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        job.wait(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)  # rank 0 may still be stopped
        reader.join(timeout=10)
    named = [(at, line) for at, line in lines if "stopped inside main_first()" in line]
    assert named, "".join(line for _, line in lines)
    at, line = named[0]
    assert f"rank 0 stopped inside main_first() at main_first.py:{LINE}: no heartbeat" in line
    entered = float((tmp_path / "entered").read_text())
    waited = at - entered
    print(f"rank 0 stopped -> named by rank 1 in {waited:.1f} s (hang timeout {HANG_TIMEOUT_S} s)")
    assert at - entered <= HANG_TIMEOUT_S + 10, at - entered
    assert job.returncode != 0


def _kill_rank0(folder: Path) -> None:
    for pid in processes_running(str(folder)):
        if rank_of(pid) == 0:
            os.kill(pid, signal.SIGKILL)
