"""`ddpkit run` as a user types it: real processes, real exit codes, readable errors."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from helpers.launch_helpers import (
    SCRIPTS,
    ddpkit_cli,
    folder_names,
    processes_running,
    worker_lines,
)

pytestmark = pytest.mark.multiproc


def test_plain_torchrun_script_runs_unchanged() -> None:
    done = ddpkit_cli("run", "--nproc", "2", str(SCRIPTS / "plain_allreduce.py"))
    assert done.returncode == 0, done.stderr
    assert "rank 0 of 2: sum of ranks = 1" in done.stdout
    assert "rank 1 of 2: sum of ranks = 1" in done.stdout


@pytest.mark.parametrize("nproc", ["0", "-1"])
def test_nproc_below_one_is_a_clear_error(nproc: str) -> None:
    done = ddpkit_cli("run", "--nproc", nproc, str(SCRIPTS / "plain_allreduce.py"))
    assert done.returncode == 2
    assert f"--nproc must be a positive integer (got {nproc})" in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_script_is_named() -> None:
    done = ddpkit_cli("run", "--nproc", "2", "no/such/train.py")
    assert done.returncode == 2
    assert "script no/such/train.py does not exist" in done.stderr
    assert "Traceback" not in done.stderr.split("ddpkit run:")[-1]


def test_failing_worker_sets_exit_code_and_names_the_rank() -> None:
    done = ddpkit_cli("run", "--nproc", "2", str(SCRIPTS / "crash_on_rank1.py"))
    assert done.returncode == 1
    assert "worker rank 1 failed (exit code 1)" in done.stderr
    assert "deliberate failure on rank 1" in done.stderr  # the worker's own traceback is shown
    assert processes_running("crash_on_rank1.py") == []  # no orphan workers


def test_wine_example_trains_to_high_accuracy_on_two_workers(tmp_path: Path) -> None:
    done = ddpkit_cli(
        "run", "--nproc", "2", "examples/wine.py", "--epochs", "60",
        "--checkpoint-dir", str(tmp_path), "--save-every", "30",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    last = worker_lines(done.stdout.strip())[-1]
    assert last.startswith("test accuracy") and "2 workers" in last
    assert float(last.split()[2]) >= 0.9
    assert done.stdout.count("epoch 60/60") == 1  # rank 0 alone logs
    assert folder_names(tmp_path) == ["epoch_000030.pt", "epoch_000060.pt"]


def test_a_busy_master_port_is_one_line_naming_the_process_that_holds_it() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        node0 = ["--nproc", "1", "--nnodes", "2", "--node-rank", "0"]
        done = ddpkit_cli("run", *node0, "--master", f"127.0.0.1:{port}", "examples/wine.py")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"ddpkit run: error: 127.0.0.1:{port} is in use (by pid {os.getpid()}): node 0 cannot "
        "host the rendezvous store there. Pick another port (--master ADDR:PORT or "
        f"--master-port) or stop pid {os.getpid()}"
    )
    assert "Traceback" not in done.stderr
