"""`ddpkit doctor` as a user runs it on this CPU machine: real launcher, real gloo."""

from __future__ import annotations

import csv
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddpkit.launch import jobs
from ddpkit.tools.doctor.probe import probe_env
from helpers.launch_helpers import REPO, ddpkit_cli, processes_running, snapshot

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.skipif(torch.cuda.is_available(), reason="expects a CPU-only machine"),
]


def free_master() -> str:
    # A port known to be free: 29500 may be taken by a job on a developer's machine.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_doctor_reports_this_cpu_machine() -> None:
    done = ddpkit_cli("doctor", "--master", free_master(), timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    built_with_nccl = "yes" if torch.distributed.is_nccl_available() else "no"  # CUDA builds
    assert f"gloo yes, nccl {built_with_nccl}" in out
    assert "gpus: none" in out
    assert "SKIP  nccl: no GPU" in out
    assert re.search(
        r"^PASS  backend gloo: all_reduce on a 1-process group in [\d.]+ ms$", out, re.M
    )
    assert "PASS  launcher: no launcher: a world of one" in out
    assert "Traceback" not in out + done.stderr


def test_doctor_smoke_runs_a_correct_all_reduce_on_two_ranks() -> None:
    done = ddpkit_cli("doctor", "--smoke", "--master", free_master(), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.search(
        r"^PASS  smoke: all_reduce correct on 2 ranks \(gloo\); 16 MiB at ([\d.]+) GB/s bus "
        r"bandwidth$",
        done.stdout,
        re.M,
    )
    assert found, done.stdout
    assert float(found.group(1)) > 0
    table = [line.split() for line in done.stdout.splitlines() if line.endswith("GB/s")]
    assert [row[0] + " " + row[1] for row in table] == ["4 KiB", "64 KiB", "1 MiB", "16 MiB"]
    assert float(table[-1][4]) > 0 and float(table[-1][6]) > 0  # 16 MiB: algbw, busbw


def test_doctor_run_gives_the_batch_and_lr_advice_as_json(
    user_checkpoints: Path, user_logs: Path
) -> None:
    """Its short run leaves the script's checkpoint folder as it was (an earlier run's 3
    epochs, which the script would otherwise continue to a 4th and save), and its curves."""
    before = snapshot(user_checkpoints), snapshot(user_logs)
    done = ddpkit_cli(
        "doctor", "--json", "--master", free_master(), "--run", "examples/wine.py", "--epochs", "4",
        "--checkpoint-dir", str(user_checkpoints), "--log-dir", str(user_logs), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (snapshot(user_checkpoints), snapshot(user_logs)) == before
    report = json.loads(done.stdout)  # nothing but the JSON on stdout
    checks = {c["name"]: c for c in report["checks"]}
    advice = checks["batch and lr"]
    assert advice["status"] == "WARN", advice
    assert "global batch 64 = 32 per device x 2 rank(s)" in advice["detail"]
    assert "lr_scaling none" in advice["detail"]
    assert checks["gpu utilization"] == {
        "name": "gpu utilization", "status": "SKIP", "detail": "no GPU", "fix": None,
    }  # fmt: skip
    assert report["run"]["setup"]["world_size"] == 2
    assert report["run"]["command"] == (
        f"ddpkit run --nproc 2 examples/wine.py --epochs 4 --checkpoint-dir {user_checkpoints} "
        f"--log-dir {user_logs}"
    )


def test_a_run_told_what_doctor_tells_its_run_closes_its_experiment_log(tmp_path: Path) -> None:
    """doctor's short run ends at its step limit (DDPKIT_MAX_STEPS): the loop runs its end
    hooks before the process ends, so the experiment log is whole and closed (it used to end
    with os._exit inside the step, the CSV's buffer never written)."""
    (tmp_path / "doctor").mkdir()  # doctor's temporary folder
    env = {**os.environ, **probe_env(tmp_path / "doctor", steps=4)}
    done = subprocess.run(
        [sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "examples/wine.py", "--epochs",
         "5", "--log-dir", str(tmp_path / "mine")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "ddpkit: stopped after 4 optimizer steps (DDPKIT_MAX_STEPS)" in done.stdout
    [log] = (tmp_path / "doctor" / "logs").glob("*/metrics.csv")
    with log.open(newline="") as rows:
        steps = [int(row["step"]) for row in csv.DictReader(rows) if row["tag"] == "train/loss"]
    assert steps == [1, 2, 3, 4]
    assert not (tmp_path / "mine").exists()  # the script's own folder is left alone


def test_a_run_past_its_timeout_is_stopped_with_all_its_workers(tmp_path: Path) -> None:
    script = tmp_path / "sleeps_forever.py"
    script.write_text("import time\ntime.sleep(600)\n")
    outcome = jobs.run_command(jobs.ddpkit_run_command(2, str(script), []), {}, timeout=4)
    assert outcome.returncode is None
    assert "did not finish within 4 s" in str(outcome.failure("the run"))
    assert processes_running(str(script)) == []  # no orphan launcher or workers
