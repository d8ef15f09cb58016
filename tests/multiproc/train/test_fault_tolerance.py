"""Faults on real jobs: killed workers, signals, deaths mid-write, NaN losses.

Each job is `ddpkit run` as a user types it (2 gloo workers on loopback, the wine example),
and every test ends by checking that no process of the job is left.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import ddpkit
from ddpkit._core.protocol import PREEMPTED_EXIT_CODE
from ddpkit.checkpoint import list_checkpoints, load_checkpoint
from helpers import mp_workers
from helpers.jobs import Job, wait_for_no_processes
from helpers.launch_helpers import SCRIPTS, ddpkit_cli, folder_names, processes_running

pytestmark = pytest.mark.multiproc

EPOCHS = 120  # 3 steps per epoch: 360 steps, a few seconds on 2 cores
# Where a stop lands: at the next step, or at an epoch's end when the signal came in between.
WHERE = r"(?:epoch \d+, step \d+|the end of epoch \d+)"


def wine_args(folder: Path, *launcher: str) -> list[str]:
    return ["run", "--nproc", "2", *launcher, "examples/wine.py", "--epochs", str(EPOCHS),
            "--checkpoint-dir", str(folder), "--save-every-steps", "7"]  # fmt: skip


def final_model(folder: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(folder / f"epoch_{EPOCHS:06d}.pt")["model"]


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The final parameters of the same job run without a fault: what every resume must hit."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    done = ddpkit_cli(*wine_args(folder), timeout=180)
    assert done.returncode == 0, done.stderr
    return final_model(folder)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """Start jobs; afterwards, none of their processes may remain."""
    started: list[Job] = []

    def start(*launcher: str) -> Job:
        started.append(Job(wine_args(tmp_path / "ckpt", *launcher), tmp_path / "ckpt"))
        return started[-1]

    yield start
    for each in started:
        if each.process.poll() is None:
            each.process.kill()
    leftover = wait_for_no_processes(str(tmp_path))
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"processes of the job outlived it: {leftover}"


@pytest.mark.oldest_torch
def test_a_worker_killed_mid_epoch_is_restarted_and_the_run_ends_identical(
    job: Callable[..., Job], uninterrupted: dict[str, torch.Tensor]
) -> None:
    # from storage: what a restart does without memory snapshots (test_memory_restart.py)
    run = job("--max-restarts", "1", "--no-memory-snapshots")
    run.wait_for_checkpoint()
    os.kill(run.worker(rank=1), signal.SIGKILL)
    code, out, err = run.finish()
    assert code == 0, err
    assert "restart 1 of 1" in out
    assert re.search(r"resumed from \S+_step_\d+\.pt \(epoch \d+, step \d+\)", out), out
    assert_identical(final_model(run.folder), uninterrupted)


def test_sigterm_to_the_launcher_checkpoints_exits_75_and_the_next_run_resumes(
    job: Callable[..., Job], uninterrupted: dict[str, torch.Tensor]
) -> None:
    run = job()
    run.wait_for_checkpoint()
    os.kill(run.process.pid, signal.SIGTERM)
    code, _, err = run.finish()
    assert code == PREEMPTED_EXIT_CODE == 75
    saved = re.search(rf"workers stopped by SIGTERM at {WHERE} after saving (\S+); run the same "
                      r"command again to resume \(exit code 75\)", err)  # fmt: skip
    assert saved, err
    load_checkpoint(saved.group(1))  # complete, checksum intact
    again = ddpkit_cli(*wine_args(run.folder), timeout=180)
    assert again.returncode == 0, again.stderr
    assert f"resumed from {saved.group(1)}" in again.stdout
    assert_identical(final_model(run.folder), uninterrupted)


@pytest.mark.oldest_torch  # torch < 2.10 forwards SIGUSR1 through ddpkit's fallback
def test_sigusr1_to_every_process_as_slurm_sends_it_stops_the_job_cleanly(
    job: Callable[..., Job],
) -> None:
    run = job()
    run.wait_for_checkpoint()
    for pid in (run.process.pid, run.worker(rank=0), run.worker(rank=1)):
        os.kill(pid, signal.SIGUSR1)
    code, out, err = run.finish()
    assert code == 75, err
    assert re.search(f"stopped by SIGUSR1 at {WHERE} after saving", out) and "Traceback" not in err


def test_killing_the_launcher_outright_stops_its_workers_after_a_checkpoint(
    job: Callable[..., Job], tmp_path: Path
) -> None:
    run_logs = tmp_path / "logs"
    run = job("--log-dir", str(run_logs))
    run.wait_for_checkpoint()
    os.kill(run.process.pid, signal.SIGKILL)
    run.process.wait()
    assert wait_for_no_processes(str(run.folder)) == []  # the workers did not outlive it
    # With the launcher gone, nobody prints the workers' last lines: --log-dir keeps them.
    [out] = run_logs.glob("*/attempt_0/0/stdout.log")
    assert re.search(f"stopped by SIGTERM at {WHERE} after saving", out.read_text()), out
    load_checkpoint(list_checkpoints(run.folder)[-1])


def test_ctrl_c_on_the_launcher_stops_every_worker_at_once(job: Callable[..., Job]) -> None:
    run = job()
    run.wait_for_checkpoint()
    os.kill(run.process.pid, signal.SIGINT)
    code, _, err = run.finish()
    assert code == 130
    assert "ddpkit run: got SIGINT; all workers were stopped" in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_a_killed_worker_without_restarts_ends_the_job_with_its_peer(
    job: Callable[..., Job],
) -> None:
    run = job()
    run.wait_for_checkpoint()
    os.kill(run.worker(rank=1), signal.SIGKILL)
    code, _, err = run.finish()
    assert code == 128 + signal.SIGKILL
    assert "worker rank 1 failed (killed by signal 9)" in err


def test_dying_between_write_and_rename_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    script = str(SCRIPTS / "die_while_saving.py")
    died = ddpkit_cli("run", "--nproc", "2", script, str(tmp_path), "--die-on-save", "2")
    assert died.returncode == 128 + signal.SIGKILL, died.stderr
    temporary, kept = folder_names(tmp_path)  # "." sorts first
    assert kept == "epoch_000001.pt" and re.fullmatch(r"\.epoch_000002\.pt\.\w+\.tmp", temporary)
    assert load_checkpoint(tmp_path / "epoch_000001.pt")["epoch"] == 1  # whole and intact
    again = ddpkit_cli("run", "--nproc", "2", script, str(tmp_path))
    assert again.returncode == 0, again.stderr
    assert f"resumed from {tmp_path / 'epoch_000001.pt'}" in again.stdout
    assert folder_names(tmp_path) == [
        "epoch_000001.pt", "epoch_000002.pt", "epoch_000003.pt"]  # fmt: skip
    assert processes_running(str(tmp_path)) == []


def test_a_nan_loss_on_one_rank_stops_every_rank_naming_it() -> None:
    with pytest.raises(ddpkit.WorkerFailedError, match=r"loss is nan on rank 1 at step 3"):
        ddpkit.spawn(mp_workers.nan_loss_on_rank, 2, 1, "error")


def test_a_skipped_nan_step_is_skipped_on_every_rank_alike() -> None:
    rank0, rank1 = ddpkit.spawn(mp_workers.nan_loss_on_rank, 2, 1, "skip")
    assert rank0["skipped"] == rank1["skipped"] == 1 and rank0["steps"] == 5
    assert mp_workers.max_abs_diff(rank0["state"], rank1["state"]) == 0.0  # replicas agree
    assert all(torch.isfinite(t).all() for t in rank0["state"].values())


def test_spawn_gives_the_callers_signal_handlers_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    ddpkit.spawn(mp_workers.world_fields, 2)
    assert {sig: signal.getsignal(sig) for sig in before} == before
