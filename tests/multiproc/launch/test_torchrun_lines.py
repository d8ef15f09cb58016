"""torchrun command lines run unchanged under `ddpkit run`: same ranks, arguments and logs.

Each line of the table (tests/helpers/torchrun_table.py; docs/torchrun.md names where each
comes from) is expanded by bash with its variables set for this one CPU host, then runs twice in
a scratch folder: as `torchrun ARGS` and as `ddpkit run ARGS`, the training script (or module)
replaced by tests/scripts/show_launch.py, which prints what its worker was given. The printed
lines (with torchrun's `[role N]:` prefixes where --tee adds them) must be the same.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from torch.distributed.run import get_args_parser

from helpers.launch_helpers import SCRIPTS, worker_lines
from helpers.torchrun_table import LINES, Line

pytestmark = pytest.mark.multiproc
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
DDPKIT_RUN = [sys.executable, "-m", "ddpkit", "run"]


def expanded(entry: Line) -> list[str]:
    """The line's torchrun arguments, as bash expands them with the entry's variables."""
    command = entry.line.replace("torchrun ", "printf '%s\\0' ", 1)
    env = {"PATH": os.environ["PATH"], **entry.variables}
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env,
                          check=True)  # fmt: skip
    return done.stdout.split("\0")[:-1]


def place_stand_in(args: list[str], folder: Path) -> None:
    """show_launch.py where the line's script or module would be."""
    parsed = get_args_parser().parse_args(args)
    name = parsed.training_script
    if parsed.module:
        target = folder.joinpath(*name.split(".")).with_suffix(".py")
        for package in target.relative_to(folder).parents:
            (folder / package).mkdir(parents=True, exist_ok=True)
            (folder / package / "__init__.py").touch()
    else:
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(SCRIPTS / "show_launch.py", target)


def launch(launcher: list[str], args: list[str], folder: Path) -> list[str]:
    """Every worker's SEEN line, sorted."""
    env = {**os.environ, "PYTHONPATH": str(folder)}
    done = subprocess.run([*launcher, *args], cwd=folder, capture_output=True, text=True,
                          timeout=180, env=env)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return sorted(line for line in worker_lines(done.stdout) if "SEEN" in line)


@pytest.mark.parametrize("entry", LINES, ids=[entry.source for entry in LINES])
def test_the_line_runs_alike_under_torchrun_and_ddpkit_run(entry: Line, tmp_path: Path) -> None:
    args = expanded(entry)
    place_stand_in(args, tmp_path)
    expected = launch([TORCHRUN], args, tmp_path)
    assert expected  # the stand-in ran
    assert launch(DDPKIT_RUN, args, tmp_path) == expected


def log_files(folder: Path) -> dict[str, str]:
    """The --log-dir files by path below the run's own folder (named by its run id)."""
    return {"/".join(p.relative_to(folder).parts[1:]): p.read_text()
            for p in sorted(folder.rglob("*.log"))}  # fmt: skip


@pytest.mark.parametrize("logs", [["--tee", "3"], ["-r", "1"], ["--redirects", "3", "-t", "2"]])
def test_log_dir_files_match_torchruns_and_are_kept(logs: list[str], tmp_path: Path) -> None:
    shutil.copy(SCRIPTS / "show_launch.py", tmp_path / "train.py")
    found = {}
    for name, launcher in (("torchrun", [TORCHRUN]), ("ddpkit", DDPKIT_RUN)):
        launch(launcher, ["--nproc-per-node", "2", "--log-dir", name, *logs, "train.py"], tmp_path)
        found[name] = log_files(tmp_path / name)
    assert found["ddpkit"] == found["torchrun"]
    assert {"attempt_0/0/stdout.log", "attempt_0/1/stdout.log"} <= set(found["ddpkit"])


def test_standalone_module_and_auto_tee_command_lines(tmp_path: Path) -> None:
    line = Line("issue 19", "torchrun --standalone --nproc_per_node=2 -m pkg.train --lr 0.1")
    args = expanded(line)
    place_stand_in(args, tmp_path)
    assert len(launch(DDPKIT_RUN, args, tmp_path)) == 2
    shutil.copy(SCRIPTS / "show_launch.py", tmp_path / "train.py")
    auto = ["--nproc-per-node", "auto", "--log-dir", "kept", "--tee", "3", "train.py"]
    seen = launch(DDPKIT_RUN, auto, tmp_path)
    assert seen and all(line.startswith("[default") for line in seen)
    assert len(log_files(tmp_path / "kept")) == 2 * len(seen)  # each rank's stdout and stderr


def test_no_python_runs_the_executable_itself(tmp_path: Path) -> None:
    args = ["--no-python", "--nproc", "2", "bash", "-c", "echo SEEN rank=$RANK of $WORLD_SIZE"]
    assert launch(DDPKIT_RUN, args, tmp_path) == ["SEEN rank=0 of 2", "SEEN rank=1 of 2"]
