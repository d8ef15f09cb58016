"""The async-save script (tests/scripts/async_saves.py) as a job to time, kill and resume.

Shared by the 2-worker CPU tests and the one-GPU tier: ``nproc`` workers, each on its own
device (a GPU each where CUDA is present, so the GPU tier runs one).
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch

from ddpkit.checkpoint import list_checkpoints
from helpers.jobs import kill_9, workers_of
from helpers.launch_helpers import REPO, SCRIPTS

EPOCHS = os.environ.get("ASYNC_SAVES_EPOCHS", "3")  # the script reads it too (50 kills: 10)
DONE = f"epoch {EPOCHS}/{EPOCHS}"


def start(folder: Path, out: Path, strategy: str = "ddp", nproc: int = 2) -> subprocess.Popen[str]:
    # Unmerged output: a launcher killed with SIGKILL takes the lines its merged console
    # still held with it, and these tests read what the killed job printed.
    command = [sys.executable, "-m", "ddpkit", "run", "--nproc", str(nproc), "--no-merge-output",
               str(SCRIPTS / "async_saves.py"), str(folder), str(out)]  # fmt: skip
    env = {**os.environ, "ASYNC_SAVES_STRATEGY": strategy}
    return subprocess.Popen(command, cwd=REPO, text=True, stdout=subprocess.PIPE, env=env,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def temporaries(folder: Path, checkpoints_only: bool = True) -> set[str]:
    """The temporaries of writes in progress (or torn): a checkpoint's, or with
    ``checkpoints_only=False`` any (doctor's save times are written the same way)."""
    pattern = ".epoch_*.tmp" if checkpoints_only else ".*.tmp"
    return {p.name for p in folder.glob(pattern)} if folder.is_dir() else set()


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


def uninterrupted(folder: Path, strategy: str, nproc: int = 2) -> Reference:
    job = start(folder / "ck", folder / "out.pt", strategy, nproc)
    writes = write_times(folder / "ck", job)
    output = finish(job)
    assert "saved" in output and DONE in output, output
    where = "pinned CPU memory" if torch.cuda.is_available() else "CPU memory"
    copied = re.search(rf"async_save: each save is copied to {where} \((\d+) MB on this", output)
    # 4.7M parameters and Adam's 2 moments; FSDP's ranks each hold a 1/nproc shard
    expected_mb = 54 if strategy == "ddp" else 54 // nproc
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


def kill_during_writes_then_finish(
    tmp_path: Path, strategy: str, count: int, reference: Reference, nproc: int = 2
) -> None:
    folder, out, chance = tmp_path / "ck", tmp_path / "out.pt", random.Random(0)
    # The kill comes a random moment within the first quarter of the uninterrupted run's
    # shortest write: writes spread about 3x within one run on a loaded 2-core machine
    # (DDP's 57 MB: 0.17-0.51 s; FSDP's shards: 0.48-0.95 s, measured), so even a write that
    # is faster than any seen is still in flight. The torn write left behind proves it was.
    inside_s = reference.shortest_write_s / 4
    newest: Path | None = None  # the newest complete checkpoint: the next run's start
    hits, tries = 0, 0
    # A loaded machine can still deschedule this poll past a fast write's rename (CI: a
    # 0.05 s write, the kill 0.012 s later, came after it): such a kill tests nothing new,
    # so it is counted as a miss and tried again, a bounded number of times.
    while hits < count:
        assert tries < 3 * count, f"{tries} kills, {hits} inside a write: writes too fast to hit"
        tries += 1
        job = start(folder, out, strategy, nproc)
        torn = kill_inside_a_write(folder, job, chance.uniform(0, inside_s), nproc)
        output = finish(job)
        resumed = re.findall(r"resumed from (\S+) ", output)
        assert resumed == ([str(newest)] if newest else []), output  # the newest, or none yet
        complete = list_checkpoints(folder)
        assert complete and complete[-1] != newest, output  # and after one of this run's
        newest = complete[-1]
        hits += (folder / torn).exists()  # the torn write left behind: the kill was inside it
    output = finish(start(folder, out, strategy, nproc))
    assert f"resumed from {newest}" in output and DONE in output, output
    assert temporaries(folder, checkpoints_only=False) == set()  # the torn writes were removed
    final = final_state(out)
    assert [k for k in reference.state if not torch.equal(reference.state[k], final[k])] == []


def kill_inside_a_write(
    folder: Path, job: subprocess.Popen[str], delay_s: float, nproc: int = 2
) -> str:
    """Once the job completed a checkpoint of its own and started writing the next one,
    SIGKILL the job ``delay_s`` later; the temporary file of the write it was in."""
    before = set(list_checkpoints(folder)) if folder.is_dir() else set()
    deadline = time.monotonic() + 180
    workers: list[int] | None = None
    while time.monotonic() < deadline and job.poll() is None:
        # Its own checkpoint first: resuming removed what the killed run before left, and
        # a rename is atomic, so a temporary file seen after it is a later write's.
        mine = set(list_checkpoints(folder)) - before if folder.is_dir() else set()
        if mine and workers is None:
            # Looked up once they have saved, before the write to hit: walking /proc
            # between seeing the write and the kill let a fast write finish first.
            workers = workers_of(job.pid)
            assert len(workers) == nproc, workers
        writing = temporaries(folder) if mine else set()
        if writing and workers is not None:
            time.sleep(delay_s)
            kill_9(job, workers)
            return writing.pop()
        time.sleep(0.002)
    raise AssertionError(f"no write after a complete checkpoint:\n{finish(job)}")
