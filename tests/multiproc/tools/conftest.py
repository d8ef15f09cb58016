"""An earlier training run's checkpoint and log folders, as a user who followed the README has
them: the tools must leave them as they found them and answer as they would in a clean folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launch_helpers import REPO


@pytest.fixture(scope="session")
def earlier_wine_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/wine.py trained for 3 epochs (more than the tools' runs ask for), its
    experiment log beside its checkpoints in ``logs``."""
    folder = tmp_path_factory.mktemp("earlier") / "runs-wine"
    done = subprocess.run(
        [sys.executable, "examples/wine.py", "--epochs", "3", "--checkpoint-dir", str(folder),
         "--log-dir", str(folder.with_name("logs"))],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return folder


@pytest.fixture
def user_checkpoints(earlier_wine_run: Path, tmp_path: Path) -> Path:
    """A copy of that folder for one test."""
    return Path(shutil.copytree(earlier_wine_run, tmp_path / "user-runs-wine"))


@pytest.fixture
def user_logs(earlier_wine_run: Path, tmp_path: Path) -> Path:
    """A copy of that run's experiment log for one test."""
    return Path(shutil.copytree(earlier_wine_run.with_name("logs"), tmp_path / "user-logs"))
