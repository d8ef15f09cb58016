"""SIGTERM at any moment of a job's life ends ``ddpkit run`` with 75, so a SLURM script that
requeues on 75 (``ddpkit slurm --requeue``) never loses a job preempted during start-up or
evaluation. During training the Trainer checkpoints first (test_fault_tolerance.py)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from helpers.jobs import Job, wait_for_no_processes, wait_until
from helpers.launch_helpers import SCRIPTS

pytestmark = pytest.mark.multiproc


@pytest.mark.parametrize("point", ["before_init", "after_init", "after_fit"])
def test_sigterm_to_the_launcher_outside_training_exits_75(tmp_path: Path, point: str) -> None:
    run = Job(["run", "--nproc", "2", str(SCRIPTS / "stop_at.py"), str(tmp_path), point],
              tmp_path)  # fmt: skip
    wait_until((tmp_path / point).exists, 90, f"rank 0 to reach {point}")
    os.kill(run.process.pid, signal.SIGTERM)
    code, _, err = run.finish()
    assert code == 75, err
    assert "stopped by SIGTERM outside training" in err and "Traceback" not in err
    assert wait_for_no_processes(str(tmp_path)) == []


def test_sigterm_to_the_launcher_as_it_starts_exits_75(tmp_path: Path) -> None:
    run = Job(["run", "--nproc", "2", str(SCRIPTS / "stop_at.py"), str(tmp_path), "after_fit"],
              tmp_path)  # fmt: skip
    time.sleep(0.5)  # Python is up; torch (and the workers) are not yet
    os.kill(run.process.pid, signal.SIGTERM)
    code, _, err = run.finish()
    assert code == 75, err
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    assert wait_for_no_processes(str(tmp_path)) == []
