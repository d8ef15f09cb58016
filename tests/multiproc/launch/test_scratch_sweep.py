"""A launcher killed with kill -9 cannot remove its scratch folder: the next launch does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddpkit.launch.scratch import OWNER, PREFIX
from helpers.launch_helpers import REPO

pytestmark = pytest.mark.multiproc


def launch(script: Path, tmp: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TMPDIR": str(tmp)}  # a temporary directory of the test's own
    command = [sys.executable, "-m", "ddpkit", "run", "--nproc", "1", str(script)]
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)  # fmt: skip


def said(job: subprocess.Popen[bytes]) -> str:
    """What a launcher that ended wrote to stderr (nothing is read from one still running)."""
    if job.poll() is None or job.stderr is None:
        return "still running"
    return f"exit code {job.returncode}: {job.stderr.read().decode(errors='replace')}"


def scratch_folders(tmp: Path) -> list[Path]:
    return sorted(tmp.glob(PREFIX + "*"))


@pytest.mark.timeout(150)
def test_the_next_launch_removes_the_folder_a_killed_launcher_left(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(120)\n")
    (tmp_path / "quick.py").write_text("print('done')\n")
    killed = launch(tmp_path / "sleep.py", tmp)
    deadline = time.monotonic() + 60
    while not any((f / OWNER).exists() for f in scratch_folders(tmp)):
        assert time.monotonic() < deadline and killed.poll() is None, said(killed)
        time.sleep(0.1)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    left = scratch_folders(tmp)
    assert len(left) == 1  # it could not remove it
    quick = launch(tmp_path / "quick.py", tmp)
    assert quick.wait(timeout=90) == 0, said(quick)
    left = scratch_folders(tmp)
    assert left == [], f"still there: {[str(p) for f in left for p in f.rglob('*')]}"
