"""Uncaught ddpkit errors end a plain `python script.py` with the user's line and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """\
import ddpkit
ddpkit.init()
"""


# A batch script of a 2-task SLURM job, with nothing started by srun: a ConfigError.
BATCH_SCRIPT_OF_TWO_TASKS = {"SLURM_JOB_ID": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}


def run_script(tmp_path: Path, text: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(text)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)  # fmt: skip


def test_a_ddpkit_error_shows_the_callers_line_and_the_fix(tmp_path: Path) -> None:
    done = run_script(tmp_path, SCRIPT, **BATCH_SCRIPT_OF_TWO_TASKS)
    assert done.returncode == 1
    assert done.stderr.splitlines()[:3] == [
        f'  File "{tmp_path / "train.py"}", line 2, in <module>',
        "    ddpkit.init()",
        "ddpkit.errors.ConfigError: SLURM_NTASKS=2 but this process is job 4's batch script, "
        "not one of its 2 tasks: nothing starts rank 1, so rank 0 would wait for them until "
        "the time limit. Start one task per worker with `srun python train.py`, or one per "
        "node with `srun ddpkit run --nproc N train.py` and #SBATCH --ntasks-per-node=1 "
        "(`ddpkit slurm` writes that script).",
    ]
    assert "rendezvous.py" not in done.stderr and "Traceback" not in done.stderr


def test_the_full_traceback_on_request(tmp_path: Path) -> None:
    done = run_script(tmp_path, SCRIPT, **BATCH_SCRIPT_OF_TWO_TASKS, DDPKIT_FULL_TRACEBACK="1")
    assert "Traceback (most recent call last)" in done.stderr and "world.py" in done.stderr


def test_other_errors_keep_pythons_traceback(tmp_path: Path) -> None:
    text = "import ddpkit\nddpkit.init()\nraise KeyError('mine')\n"
    done = run_script(tmp_path, text)
    assert "Traceback (most recent call last)" in done.stderr
    assert done.stderr.rstrip().endswith("KeyError: 'mine'")
