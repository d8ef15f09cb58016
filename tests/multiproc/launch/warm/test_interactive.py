"""ddpkit.spawn from a real interactive interpreter (`python -i`, fed through a pipe as a user
types): a function typed there runs on 2 workers, and its failure comes back as an error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.launch_helpers import REPO

pytestmark = pytest.mark.multiproc

TYPED = """\
import ddpkit
def work(scale):
    world = ddpkit.init()
    if scale < 0:
        raise ValueError(f"bad scale on rank {world.rank}")
    return world.rank * scale

"""


def interactive(lines: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-i", "-q"], input=TYPED + lines, cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_function_typed_into_the_repl_runs_on_two_workers() -> None:
    done = interactive('print("RESULT", ddpkit.spawn(work, 2, 10))\n')
    assert "RESULT [0, 10]" in done.stdout, done.stderr
    assert "Traceback" not in done.stderr


def test_its_failure_comes_back_as_the_workers_error() -> None:
    done = interactive(
        "try:\n    ddpkit.spawn(work, 2, -1)\n"
        "except ddpkit.WorkerFailedError as err:\n    print('CAUGHT', err.rank, err)\n\n"
    )
    assert "CAUGHT 0 worker rank 0 failed (exit code 1)" in done.stdout, done.stderr
    assert "ValueError: bad scale on rank 0" in done.stdout
