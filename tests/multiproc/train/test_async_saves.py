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
import re
import signal
from pathlib import Path

import pytest
import torch

from ddpkit._core.protocol import PREEMPTED_EXIT_CODE
from ddpkit.checkpoint import list_checkpoints
from helpers.async_saves import (
    DONE,
    Reference,
    final_state,
    finish,
    kill_during_writes_then_finish,
    start,
    uninterrupted,
    wait_for_a_write,
)

pytestmark = pytest.mark.multiproc

KILLS = int(os.environ.get("DDPKIT_TEST_ASYNC_KILLS", "2"))  # the note records a run of 50
SHARDED_KILLS = int(os.environ.get("DDPKIT_TEST_ASYNC_SHARDED_KILLS", "1"))


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
