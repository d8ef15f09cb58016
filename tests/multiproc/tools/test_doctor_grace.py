"""doctor's grace-period check fed by a real run: the save times a `ddpkit run` job's
checkpointer recorded beside its checkpoints are the ones `ddpkit doctor` compares."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from ddpkit.checkpoint.savetimes import SAVE_TIMES_FILE
from helpers.launch_helpers import ddpkit_cli

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.skipif(torch.cuda.is_available(), reason="expects a CPU-only machine"),
]


@pytest.mark.timeout(240)
def test_doctor_compares_the_grace_period_with_the_saves_a_real_run_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "runs-wine"
    saved, took = train_with_saves(folder)
    assert saved == ["epoch_000001.pt", "epoch_000002.pt", "epoch_000003.pt"]
    monkeypatch.setenv("DDPKIT_GRACE_PERIOD", "30")  # as `ddpkit k8s` writes it into the pod
    check = doctor_check(folder, "grace period")
    assert check["status"] == "PASS", check  # SKIP: "no save recorded in FOLDER yet"
    recorded = json.loads((folder / SAVE_TIMES_FILE).read_text())
    assert [save["name"] for save in recorded] == saved  # one time per save: rank 0's
    assert all(0 <= save["seconds"] < took for save in recorded)
    slowest = max(recorded, key=lambda save: save["seconds"])
    assert check["detail"] == (
        "30 s between SIGTERM and SIGKILL; the slowest recent save took "
        f"{slowest['seconds']:.1f} s ({slowest['name']})"
    )


def train_with_saves(folder: Path) -> tuple[list[str], float]:
    """`ddpkit run --nproc 2 examples/wine.py`, a checkpoint each of 3 epochs: the names its
    log says it saved, and the job's seconds."""
    started = time.monotonic()
    job = ddpkit_cli("run", "--nproc", "2", "examples/wine.py", "--epochs", "3",
                     "--save-every", "1", "--checkpoint-dir", str(folder), timeout=180)  # fmt: skip
    assert job.returncode == 0, job.stdout + job.stderr
    return re.findall(r"saved \S+/(epoch_\d+\.pt)$", job.stdout, re.M), time.monotonic() - started


def doctor_check(folder: Path, name: str) -> dict[str, Any]:
    """The check ``name`` of `ddpkit doctor --json --checkpoint-dir FOLDER`."""
    done = ddpkit_cli("doctor", "--json", "--checkpoint-dir", str(folder), timeout=60)
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 1: another check FAILed
    checks = {check["name"]: check for check in json.loads(done.stdout)["checks"]}
    return dict(checks[name])
