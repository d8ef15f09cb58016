"""The examples beyond the classifier, as users run them: a GPT, a GAN, a hand-written loop.

Each trains on 2 gloo workers through `ddpkit run`, passes `ddpkit verify`, and after a fault
(a worker killed mid-epoch under --max-restarts 1, or SIGTERM to the launcher and a second
run) ends with parameters bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import math
import os
import re
import signal
from pathlib import Path

import pytest
import torch

from ddpkit._core.protocol import PREEMPTED_EXIT_CODE
from ddpkit.checkpoint import load_checkpoint
from helpers.jobs import Job, wait_for_no_processes
from helpers.launch_helpers import ddpkit_cli

pytestmark = pytest.mark.multiproc

# script, its epochs, the arguments that make it checkpoint often
EXAMPLES = {
    "gpt": ("examples/gpt.py", 2, ["--save-every-steps", "10"]),
    "gan": ("examples/gan.py", 20, ["--save-every-steps", "10"]),
    "loop": ("examples/loop.py", 60, ["--save-every-steps", "5"]),
}


def run_args(name: str, folder: Path, *launcher: str) -> list[str]:
    script, epochs, extra = EXAMPLES[name]
    return ["run", "--nproc", "2", *launcher, script, "--epochs", str(epochs),
            "--checkpoint-dir", str(folder), *extra]  # fmt: skip


def final_model(name: str, folder: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(folder / f"epoch_{EXAMPLES[name][1]:06d}.pt")["model"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, dict]]:
    """Each example run once without a fault: its output and final parameters."""
    results = {}
    for name in EXAMPLES:
        folder = tmp_path_factory.mktemp(f"{name}-uninterrupted")
        done = ddpkit_cli(*run_args(name, folder), timeout=240)
        assert done.returncode == 0, done.stderr
        results[name] = (done.stdout, final_model(name, folder))
    return results


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert [n for n in a if not torch.equal(a[n], b[n])] == []


def test_the_gpt_learns_and_reports_perplexity(uninterrupted: dict[str, tuple[str, dict]]) -> None:
    out = uninterrupted["gpt"][0]
    losses = [float(v) for v in re.findall(r"val_loss (\d+\.\d+)", out)]
    assert len(losses) == 2 and losses[1] < losses[0] < math.log(256)  # below uniform, falling
    assert re.search(r"epoch 2/2  loss \S+  val_loss \S+  val_perplexity \S+", out), out
    assert re.search(r"GPT: \d{3},\d{3} parameters", out)


def test_the_gan_reports_both_losses(uninterrupted: dict[str, tuple[str, dict]]) -> None:
    out = uninterrupted["gan"][0]
    assert re.search(r"epoch 20/20  loss_d \S+  loss_g \S+  val_mode_distance \S+", out), out
    assert set(uninterrupted["gan"][1]) == {
        f"{model}.{layer}.{kind}" for model in ("generator", "discriminator")
        for layer in (0, 2, 4) for kind in ("weight", "bias")
    }  # fmt: skip


@pytest.mark.parametrize("name", ["gpt", "gan"])
def test_a_worker_killed_mid_epoch_resumes_bit_identically(
    name: str, tmp_path: Path, uninterrupted: dict[str, tuple[str, dict]]
) -> None:
    job = Job(run_args(name, tmp_path / "ckpt", "--max-restarts", "1"), tmp_path / "ckpt")
    try:
        job.wait_for_checkpoint()
        os.kill(job.worker(rank=1), signal.SIGKILL)
        code, out, err = job.finish(timeout=240)
    finally:
        job.process.kill()
    assert code == 0, err
    assert "restart 1 of 1" in out
    # from the step kept in memory (the storage path: tests/multiproc/train/)
    assert re.search(r"resumed from memory at step \d+ \(epoch \d+ batch \d+\)", out), out
    assert_identical(final_model(name, job.folder), uninterrupted[name][1])
    assert wait_for_no_processes(str(tmp_path)) == []


def test_a_hand_written_loop_checkpoints_on_sigterm_and_resumes_bit_identically(
    tmp_path: Path, uninterrupted: dict[str, tuple[str, dict]]
) -> None:
    job = Job(run_args("loop", tmp_path / "ckpt"), tmp_path / "ckpt")
    try:
        job.wait_for_checkpoint()
        os.kill(job.process.pid, signal.SIGTERM)
        code, _, err = job.finish()
    finally:
        job.process.kill()
    assert code == PREEMPTED_EXIT_CODE, err
    saved = re.search(r"workers stopped by SIGTERM at .* after saving (\S+);", err)
    assert saved, err
    again = ddpkit_cli(*run_args("loop", job.folder), timeout=240)
    assert again.returncode == 0, again.stderr
    assert f"resumed from {saved.group(1)}" in again.stdout
    assert_identical(final_model("loop", job.folder), uninterrupted["loop"][1])
    assert "best test accuracy" in again.stdout


@pytest.mark.parametrize("name", ["gpt", "gan", "loop"])
def test_verify_passes(name: str) -> None:
    done = ddpkit_cli("verify", EXAMPLES[name][0], "--workers", "2", "--steps", "6", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok    data " in done.stdout and "ok    replicas " in done.stdout
    assert done.stdout.strip().endswith("PASS: 2 workers computed what one process computes")


def test_verify_names_per_rank_seeding_in_a_hand_written_loop() -> None:
    done = ddpkit_cli("verify", "tests/scripts/loop_seed_per_rank.py", "--steps", "4", timeout=240)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL  data" in done.stdout
    causes = " ".join(done.stdout.split("likely causes")[1].split())
    assert "per-rank randomness" in causes and "never with the rank" in causes
