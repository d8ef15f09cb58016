"""Checkpoints written in the background, for real: a 2-worker job killed while they are written.

tests/scripts/async_saves.py checkpoints about 57 MB every 2 steps with ``async_save=True``.
The test watches its checkpoint folder for a write in flight (a temporary file) and kills the
whole job with SIGKILL a random moment later, again and again: every next run must resume
from the newest complete checkpoint, and the last must end bit-identical to a run never
interrupted. A SIGTERM during a write must let that write complete (the ranks agree on the
stop at a later step, about a second on), write the stop's checkpoint, then exit 75. The
same kills hit an FSDP job, whose every rank writes its shards in the background.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ddpkit._core.protocol import PREEMPTED_EXIT_CODE
from ddpkit.checkpoint import list_checkpoints
from helpers.launch_helpers import REPO, SCRIPTS

pytestmark = pytest.mark.multiproc

KILLS = int(os.environ.get("DDPKIT_TEST_ASYNC_KILLS", "2"))  # the note records a run of 50
SHARDED_KILLS = int(os.environ.get("DDPKIT_TEST_ASYNC_SHARDED_KILLS", "1"))
EPOCHS = os.environ.get("ASYNC_SAVES_EPOCHS", "3")  # the script reads it too (50 kills: 10)
DONE = f"epoch {EPOCHS}/{EPOCHS}"


def start(folder: Path, out: Path, strategy: str = "ddp") -> subprocess.Popen[str]:
    # Unmerged output: a launcher killed with SIGKILL takes the lines its merged console
    # still held with it, and these tests read what the killed job printed.
    command = [sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "--no-merge-output",
               str(SCRIPTS / "async_saves.py"), str(folder), str(out)]  # fmt: skip
    env = {**os.environ, "ASYNC_SAVES_STRATEGY": strategy}
    return subprocess.Popen(command, cwd=REPO, text=True, stdout=subprocess.PIPE, env=env,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def temporaries(folder: Path) -> set[str]:
    return {p.name for p in folder.glob(".*.tmp")} if folder.is_dir() else set()


def wait_for_a_write(folder: Path, job: subprocess.Popen[str], timeout: float = 120) -> str | None:
    """The name of a checkpoint this job is writing in the background (None: it ended).
    A temporary file left by the killed run before it is not this job's."""
    left = temporaries(folder)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.poll() is None:
        writing = temporaries(folder) - left
        if writing:
            return writing.pop()
        time.sleep(0.002)
    return None


def finish(job: subprocess.Popen[str]) -> str:
    output, _ = job.communicate(timeout=240)
    return output


def final_state(out: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(out, weights_only=True)
    return loaded


def uninterrupted(folder: Path, strategy: str) -> dict[str, torch.Tensor]:
    output = finish(start(folder / "ck", folder / "out.pt", strategy))
    assert "saved" in output and DONE in output, output
    copied = re.search(
        r"async_save: each save is copied to CPU memory \((\d+) MB on this rank", output
    )
    expected_mb = {"ddp": 54, "fsdp": 27}[strategy]  # 4.7M parameters and Adam's 2 moments
    assert copied and abs(int(copied[1]) - expected_mb) <= 2, output
    return final_state(folder / "out.pt")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    return uninterrupted(tmp_path_factory.mktemp("reference"), "ddp")


@pytest.mark.timeout(900)
def test_kill_9_during_background_writes_resumes_from_the_newest_complete_one(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    kill_during_writes_then_finish(tmp_path, "ddp", KILLS, reference)


@pytest.mark.timeout(600)
def test_kill_9_during_sharded_background_writes_resumes_bit_identical(tmp_path: Path) -> None:
    reference = uninterrupted(tmp_path / "reference", "fsdp")
    kill_during_writes_then_finish(tmp_path, "fsdp", SHARDED_KILLS, reference)


def kill_during_writes_then_finish(
    tmp_path: Path, strategy: str, count: int, reference: dict[str, torch.Tensor]
) -> None:
    folder, out, chance = tmp_path / "ck", tmp_path / "out.pt", random.Random(0)
    kills = 0
    while kills < count:
        newest = (
            list_checkpoints(folder)[-1] if folder.is_dir() and list_checkpoints(folder) else None
        )
        job = start(folder, out, strategy)
        if wait_for_a_write(folder, job) is None:
            break  # the job finished before another write: nothing left to interrupt
        time.sleep(chance.uniform(0, 0.05))  # somewhere inside the write
        os.killpg(job.pid, signal.SIGKILL)
        output = finish(job)
        if newest is not None:  # this run started from the newest complete checkpoint
            assert f"resumed from {newest}" in output, output
        kills += 1
    assert kills == count
    newest = list_checkpoints(folder)[-1]
    output = finish(start(folder, out, strategy))
    assert f"resumed from {newest}" in output and DONE in output, output
    final = final_state(out)
    assert [k for k in reference if not torch.equal(reference[k], final[k])] == []


@pytest.mark.timeout(600)
def test_sigterm_during_a_background_write_completes_it_and_exits_75(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    folder, out = tmp_path / "ck", tmp_path / "out.pt"
    job = start(folder, out)
    writing = wait_for_a_write(folder, job)
    assert writing is not None
    job.send_signal(signal.SIGTERM)  # to ddpkit run, which passes it to the workers
    output = finish(job)
    assert job.returncode == PREEMPTED_EXIT_CODE, output
    in_flight = re.match(r"\.(.+\.pt)\.", writing)
    assert in_flight and f"saved {folder / in_flight[1]}" in output, (writing, output)
    stopped = re.search(r"stopped by SIGTERM at .* after saving (\S+\.pt);", output)
    assert stopped and Path(stopped[1]) == list_checkpoints(folder)[-1], output
    assert list(folder.glob(".*.tmp")) == []  # every write completed before exit 75
    again = finish(start(folder, out))
    assert "resumed from" in again and DONE in again, again
    final = final_state(out)
    assert [k for k in reference if not torch.equal(reference[k], final[k])] == []
