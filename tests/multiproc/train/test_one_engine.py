"""One engine: the Trainer and a hand-written TrainLoop make the same steps, faults included.

tests/scripts/both_faces.py trains the same configuration through either face under `ddpkit run
--nproc 2`: gradient accumulation, bf16, the guard skipping the step of a sample with NaN
features, dropout under a seed, and a user's own DataLoader with 5 batches on rank 0 and 10 on
rank 1 with step checkpoints (the hand-written loop used to desynchronise and hang there). Both
faces must end bit-identical, and each must resume to the same parameters after a worker is
killed with SIGKILL and after a SIGTERM stop.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ddpkit._core.protocol import PREEMPTED_EXIT_CODE
from helpers.jobs import Job, wait_for_no_processes
from helpers.launch_helpers import SCRIPTS, ddpkit_cli

pytestmark = pytest.mark.multiproc

FACES = ("trainer", "loop")
LONG = 60  # epochs of the `mixed` case for the fault tests: 180 steps, checkpoints every 3


def faces_args(face: str, out: Path, *extra: str, launcher: tuple[str, ...] = ()) -> list[str]:
    return ["run", "--nproc", "2", *launcher, str(SCRIPTS / "both_faces.py"), face, str(out),
            *extra]  # fmt: skip


def result(out: Path, face: str, case: str) -> dict[str, Any]:
    loaded: dict[str, Any] = torch.load(out / f"{face}-{case}.pt", weights_only=True)
    return loaded


def assert_same_run(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert [k for k in a["state"] if not torch.equal(a["state"][k], b["state"][k])] == []
    assert (a["steps"], a["skipped"], a["samples"]) == (b["steps"], b["skipped"], b["samples"])
    # An epoch's loss sums its batches in another order after a resume: equal to 1e-12. The
    # skipped step's epoch is NaN in both.
    assert all(
        x == pytest.approx(y, rel=1e-12, nan_ok=True)
        for x, y in zip(a["losses"], b["losses"], strict=True)
    )


def test_the_trainer_and_a_hand_written_loop_make_the_same_steps(tmp_path: Path) -> None:
    outputs = {}
    for face in FACES:
        done = ddpkit_cli(*faces_args(face, tmp_path, "--checkpoint-dir", str(tmp_path / face)),
                          timeout=180)  # fmt: skip
        assert done.returncode == 0, done.stderr
        outputs[face] = done.stdout
    for case in ("mixed", "uneven"):
        assert_same_run(result(tmp_path, "trainer", case), result(tmp_path, "loop", case))
    mixed, uneven = result(tmp_path, "loop", "mixed"), result(tmp_path, "loop", "uneven")
    assert mixed["skipped"] == 3 and mixed["steps"] == 9  # 5 batches, accumulate 2: 3 steps
    assert uneven["samples"] == [60.0, 60.0, 60.0]  # every sample of both ranks, each epoch
    for face in FACES:
        assert "ranks have between 5 and 10 batches" in outputs[face]
        assert "epoch 3/3" in outputs[face]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The `mixed` case run long, without a fault, through each face."""
    out = tmp_path_factory.mktemp("uninterrupted")
    for face in FACES:
        args = ("--case", "mixed", "--epochs", str(LONG), "--checkpoint-dir", str(out / face))
        done = ddpkit_cli(*faces_args(face, out, *args), timeout=240)
        assert done.returncode == 0, done.stderr
    runs = {face: result(out, face, "mixed") for face in FACES}
    assert_same_run(runs["trainer"], runs["loop"])
    return runs


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """Start the long `mixed` case; afterwards, none of its processes may remain."""
    started: list[Job] = []

    def start(face: str, *launcher: str) -> Job:
        folder = tmp_path / "ckpt"
        args = ("--case", "mixed", "--epochs", str(LONG), "--checkpoint-dir", str(folder))
        started.append(Job(faces_args(face, tmp_path, *args, launcher=launcher), folder))
        return started[-1]

    yield start
    for each in started:
        if each.process.poll() is None:
            each.process.kill()
    assert wait_for_no_processes(str(tmp_path)) == []


@pytest.mark.parametrize("face", FACES)
def test_a_worker_killed_mid_run_is_restarted_and_ends_identical(
    face: str, job: Callable[..., Job], uninterrupted: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    run = job(face, "--max-restarts", "1")
    run.wait_for_checkpoint()
    os.kill(run.worker(rank=1), signal.SIGKILL)
    code, out, err = run.finish(timeout=240)
    assert code == 0, err
    assert "restart 1 of 1" in out and "resumed from" in out
    assert_same_run(result(tmp_path, face, "mixed"), uninterrupted[face])


@pytest.mark.parametrize("face", FACES)
def test_sigterm_stops_at_a_step_with_75_and_the_next_run_ends_identical(
    face: str, job: Callable[..., Job], uninterrupted: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    run = job(face)
    run.wait_for_checkpoint()
    os.kill(run.process.pid, signal.SIGTERM)
    code, _, err = run.finish(timeout=240)
    assert code == PREEMPTED_EXIT_CODE, err
    assert "workers stopped by SIGTERM at " in err and "after saving" in err
    again = ddpkit_cli(*faces_args(face, tmp_path, "--case", "mixed", "--epochs", str(LONG),
                                   "--checkpoint-dir", str(run.folder)), timeout=240)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert_same_run(result(tmp_path, face, "mixed"), uninterrupted[face])


@pytest.mark.timeout(240)
def test_both_faces_evaluate_a_padded_dataset_as_one_process_does(tmp_path: Path) -> None:
    """37 samples on 2 ranks: the sampler repeats one; TrainLoop.evaluate, Trainer.evaluate
    and one process all report the 37 real samples' means, and the model trains again after."""
    script = str(SCRIPTS / "evaluate_faces.py")
    two = ddpkit_cli("run", "--nproc", "2", script, str(tmp_path / "two.pt"), timeout=200)
    assert two.returncode == 0, two.stdout + two.stderr
    one = ddpkit_cli("run", "--nproc", "1", script, str(tmp_path / "one.pt"), timeout=200)
    assert one.returncode == 0, one.stdout + one.stderr
    results = [torch.load(tmp_path / f"{n}.pt", weights_only=True) for n in ("two", "one")]
    reference = results[1]["loop"]
    assert reference["samples"] == 37.0, reference
    for result in results:
        assert result["training_after"] is True
        for face in ("loop", "trainer"):
            assert result[face] == pytest.approx(reference, rel=1e-6), (face, result)
