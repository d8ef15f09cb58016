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


def test_a_stop_that_finds_training_stuck_between_steps_is_not_called_a_start_up_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1's body is stuck, so no rank reaches a step where it could checkpoint; torch's
    agent kills them after its shutdown timeout. They had trained three steps: the launcher
    says so, and names the checkpoint to resume from (it said "while starting")."""
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "3")  # SIGKILL 3 s after SIGTERM
    run = Job(["run", "--nproc", "2", str(SCRIPTS / "stuck_between_steps.py"), str(tmp_path)],
              tmp_path)  # fmt: skip
    wait_until((tmp_path / "stuck").exists, 90, "rank 1 to be stuck after step 3")
    os.kill(run.process.pid, signal.SIGTERM)
    code, _, err = run.finish()
    assert code == 75, err
    assert "while starting" not in err
    assert "stopped by SIGTERM during training (newest checkpoint " in err
    assert "epoch_000001_step_000003.pt) before they reached a step where they could" in err
    assert wait_for_no_processes(str(tmp_path)) == []
