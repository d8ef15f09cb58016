"""`ddpkit verify` as a user runs it: a correct script passes, a classic mistake is named."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from helpers.launch_helpers import REPO, ddpkit_cli, snapshot

pytestmark = pytest.mark.multiproc


def test_wine_example_passes_with_every_check(
    tmp_path: Path, user_checkpoints: Path, user_logs: Path
) -> None:
    """In a folder where the script's checkpoints and logs of an earlier run lie: verify's runs
    start from nothing, as in a clean folder, and leave those files as they were."""
    before = snapshot(user_checkpoints), snapshot(user_logs)
    done = ddpkit_cli(
        "verify", "examples/wine.py", "--workers", "2", "--steps", "6", "--out", str(tmp_path),
        "--checkpoint-dir", str(user_checkpoints), "--log-dir", str(user_logs), timeout=240,
    )  # fmt: skip
    assert (snapshot(user_checkpoints), snapshot(user_logs)) == before
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout
    assert "ok    global batch    64 in both (32 per device)" in lines
    assert "142 samples, each exactly once per epoch across 2 ranks (71 per rank)" in lines
    assert "ok    data            142 samples trained on, identical in both runs" in lines
    assert "ok    replicas        identical on 2 ranks at 6 checks" in lines
    assert "ok    after 6 steps   4 tensors within rtol 0.0001 + atol 1e-06" in lines
    assert lines.strip().endswith("PASS: 2 workers computed what one process computes")
    reference = json.loads((tmp_path / "reference" / "record.json").read_text())
    assert reference["reference_for"] == 2 and reference["world_size"] == 1  # really 1 process
    assert reference["steps"] == 6  # not the earlier run's 3 epochs
    said = (tmp_path / "workers2" / "output.log").read_text()
    assert f"checkpoints go to {tmp_path}/workers2/checkpoints/" in said
    # Each run's experiment log is whole and closed although the step limit ended the run:
    # the loop ran its end hooks before leaving.
    for side in ("reference", "workers2"):
        [log] = (tmp_path / side / "logs").glob("*/metrics.csv")
        assert logged_steps(log, "train/loss") == [1, 2, 3, 4, 5, 6], side


def logged_steps(path: Path, tag: str) -> list[int]:
    with path.open(newline="") as rows:
        return [int(row["step"]) for row in csv.DictReader(rows) if row["tag"] == tag]


def test_per_rank_seeding_fails_and_names_the_cause() -> None:
    done = ddpkit_cli("verify", "tests/scripts/seed_per_rank.py", "--steps", "4", timeout=240)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL  after 4 steps" in done.stdout
    assert "FAIL  data" in done.stdout
    causes = " ".join(done.stdout.split("likely causes")[1].split())  # undo the line wrapping
    assert causes.index("per-rank randomness") < causes.index("the data differs")
    assert "never with the rank" in causes


def test_a_script_without_the_trainer_is_a_clear_error() -> None:
    done = ddpkit_cli("verify", "tests/scripts/plain_allreduce.py", "--steps", "2", timeout=240)
    assert done.returncode == 2
    assert "the single-process reference exited with code 1" in done.stderr
    assert "environment variable RANK expected" in done.stderr  # the script's own error
    assert "Traceback" not in done.stderr.split("ddpkit verify: error:")[0]


def test_the_readmes_script_runs_and_passes_verify_as_printed(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Your script", 1)[1]
    script = tmp_path / "train.py"
    script.write_text(section.split("```python\n", 1)[1].split("```", 1)[0])
    done = ddpkit_cli("verify", str(script), "--steps", "6", timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("PASS: 2 workers computed what one process computes")
    assert not (REPO / "runs" / "train").exists() and not (tmp_path / "runs").exists()


@pytest.mark.timeout(300)
def test_two_workers_then_one_from_their_checkpoint_passes(tmp_path: Path) -> None:
    """An elastic job's world changing halfway: 2 workers for 3 steps, a checkpoint, then 1
    worker resumes to step 6, and the whole equals one process (the global batch kept)."""
    done = ddpkit_cli(
        "verify", "examples/wine.py", "--workers", "2", "--then", "1", "--steps", "6",
        "--out", str(tmp_path), "--batch-size", "48", "--batch-policy", "global",
        "--checkpoint-dir", "runs/wine-then", timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 workers then 1 from step 3 vs 1 process, 6 optimizer steps" in done.stdout
    assert "ok    global batch    48 in both (24 per device)" in done.stdout
    assert "PASS: 2 workers then 1 from step 3 computed what one process computes" in done.stdout
    second = (tmp_path / "workers2-then1" / "second" / "output.log").read_text()
    assert "world size 2 -> 1: global batch 48 kept (48 per device x 1 rank)" in second
    assert "epoch_000001_step_000003.pt (epoch 1, step 3)" in second  # the first's last
