"""Checkpoints written in the background, for real: a 2-worker job killed while they are written.

tests/scripts/async_saves.py checkpoints about 57 MB every 2 steps with ``async_save=True``.
The uninterrupted runs check that a write is still in flight while training goes on (the
script's slow disk completes its first write only once training took a later step) and time
every write. The kill test waits until a job completed a checkpoint of its own and started
writing the next, then kills the whole job (the launcher and each worker) with SIGKILL a
random moment inside that write, again and again: the write must be left torn, every next run
must resume from the newest complete checkpoint, and the last must end bit-identical to a run
never interrupted. A SIGTERM during a write must let that write complete (the ranks agree on
the stop at a later step, about a second on), write the stop's checkpoint, then exit 75. The
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
from typing import NamedTuple

import pytest
import torch

from ddpkit._core.protocol import PREEMPTED_EXIT_CODE
from ddpkit.checkpoint import list_checkpoints
from helpers.jobs import children, kill_9
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


def write_times(folder: Path, job: subprocess.Popen[str]) -> list[float]:
    """How long each of the job's writes took, from its temporary file's (or directory's)
    appearance to its rename, as this poll sees them until the job ends."""
    seen: dict[str, list[float]] = {}  # name: [first seen, last seen]
    while job.poll() is None:
        now = time.monotonic()
        for name in temporaries(folder):
            seen.setdefault(name, [now, now])[1] = now
        time.sleep(0.002)
    return [last - first for first, last in seen.values()]


class Reference(NamedTuple):
    """An uninterrupted run: its final parameters, and its shortest write in seconds."""

    state: dict[str, torch.Tensor]
    shortest_write_s: float


def uninterrupted(folder: Path, strategy: str) -> Reference:
    job = start(folder / "ck", folder / "out.pt", strategy)
    writes = write_times(folder / "ck", job)
    output = finish(job)
    assert "saved" in output and DONE in output, output
    copied = re.search(
        r"async_save: each save is copied to CPU memory \((\d+) MB on this rank", output
    )
    expected_mb = {"ddp": 54, "fsdp": 27}[strategy]  # 4.7M parameters and Adam's 2 moments
    assert copied and abs(int(copied[1]) - expected_mb) <= 2, output
    # What async_save is for: training goes on while the checkpoint is written. A save that
    # holds training up (a synchronous one) passes every other check of this file.
    overlap = re.search(
        r"step (\d+)'s checkpoint was still being written after (\d+) steps", output
    )
    said = "training did not go on while the first checkpoint was written"
    assert overlap and int(overlap[2]) > int(overlap[1]), f"{said}:\n{output}"
    assert len(writes) >= 5 * int(EPOCHS), writes  # of 10 an epoch (a stalled poll misses one)
    return Reference(final_state(folder / "out.pt"), min(writes))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return uninterrupted(tmp_path_factory.mktemp("reference"), "ddp")


@pytest.mark.timeout(900)
def test_kill_9_during_background_writes_resumes_from_the_newest_complete_one(
    tmp_path: Path, reference: Reference
) -> None:
    kill_during_writes_then_finish(tmp_path, "ddp", KILLS, reference)


@pytest.mark.timeout(600)
def test_kill_9_during_sharded_background_writes_resumes_bit_identical(tmp_path: Path) -> None:
    reference = uninterrupted(tmp_path / "reference", "fsdp")
    kill_during_writes_then_finish(tmp_path, "fsdp", SHARDED_KILLS, reference)


def kill_during_writes_then_finish(
    tmp_path: Path, strategy: str, count: int, reference: Reference
) -> None:
    folder, out, chance = tmp_path / "ck", tmp_path / "out.pt", random.Random(0)
    # The kill comes a random moment within the first quarter of the uninterrupted run's
    # shortest write: writes spread about 3x within one run on a loaded 2-core machine
    # (DDP's 57 MB: 0.17-0.51 s; FSDP's shards: 0.48-0.95 s, measured), so even a write that
    # is faster than any seen is still in flight. The torn write left behind proves it was.
    inside_s = reference.shortest_write_s / 4
    newest: Path | None = None  # the newest complete checkpoint: the next run's start
    for _ in range(count):
        job = start(folder, out, strategy)
        torn = kill_inside_a_write(folder, job, chance.uniform(0, inside_s))
        output = finish(job)
        resumed = re.findall(r"resumed from (\S+) ", output)
        assert resumed == ([str(newest)] if newest else []), output  # the newest, or none yet
        assert (folder / torn).exists(), (torn, output)  # the kill came inside this write
        complete = list_checkpoints(folder)
        assert complete and complete[-1] != newest, output  # and after one of this run's
        newest = complete[-1]
    output = finish(start(folder, out, strategy))
    assert f"resumed from {newest}" in output and DONE in output, output
    assert temporaries(folder) == set()  # the torn writes were removed
    final = final_state(out)
    assert [k for k in reference.state if not torch.equal(reference.state[k], final[k])] == []


def kill_inside_a_write(folder: Path, job: subprocess.Popen[str], delay_s: float) -> str:
    """Once the job completed a checkpoint of its own and started writing the next one,
    SIGKILL the job ``delay_s`` later; the temporary file of the write it was in."""
    before = set(list_checkpoints(folder)) if folder.is_dir() else set()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and job.poll() is None:
        # Its own checkpoint first: resuming removed what the killed run before left, and
        # a rename is atomic, so a temporary file seen after it is a later write's.
        mine = set(list_checkpoints(folder)) - before if folder.is_dir() else set()
        writing = temporaries(folder) if mine else set()
        if writing:
            workers = children(job.pid)  # looked up first, so that the kill comes on time
            assert len(workers) == 2, workers
            time.sleep(delay_s)
            kill_9(job, workers)
            return writing.pop()
        time.sleep(0.002)
    raise AssertionError(f"no write after a complete checkpoint:\n{finish(job)}")


@pytest.mark.timeout(600)
def test_sigterm_during_a_background_write_completes_it_and_exits_75(
    tmp_path: Path, reference: Reference
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
    assert [k for k in reference.state if not torch.equal(reference.state[k], final[k])] == []
