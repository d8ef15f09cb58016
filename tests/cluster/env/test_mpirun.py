"""OpenMPI's mpirun starts the job for real (Debian's openmpi-bin, installed when missing)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.launch_helpers import REPO, ensure_debian_package, metric_lines

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(300)  # a first run may install openmpi-bin
def test_mpirun_trains_like_ddpkit_run(wine_reference: list[str]) -> None:
    mpirun = ensure_debian_package("mpirun", "openmpi-bin")
    command = [mpirun, "-np", "2", "--oversubscribe", sys.executable, "examples/wine.py",
               "--epochs", "5"]  # fmt: skip
    if os.geteuid() == 0:
        command.insert(1, "--allow-run-as-root")  # CI containers run as root
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "world size 2 (2 processes per node x 1 node)" in done.stdout
    assert "ranks from OMPI_COMM_WORLD_RANK" in done.stdout  # not from a ddpkit launcher
    assert metric_lines(done.stdout) == wine_reference
