"""Hangs and mismatched collectives end the job with a report, not a long silence."""

from __future__ import annotations

import re
import time

import pytest

from helpers.launch_helpers import SCRIPTS, ddpkit_cli, processes_running

pytestmark = [pytest.mark.multiproc, pytest.mark.serial]  # timed: runs alone (make test)

HANG_TIMEOUT_S = 5


def test_a_rank_that_never_reaches_a_collective_is_named_and_the_job_exits() -> None:
    script = SCRIPTS / "sleep_before_collective.py"
    done = ddpkit_cli("run", "--nproc", "2", "--hang-timeout", str(HANG_TIMEOUT_S), str(script))
    ended = time.time()
    assert done.returncode == 124, done.stderr  # the watchdog's documented exit code
    entered = float(re.search(r"rank 0 enters the collective at ([\d.]+)", done.stdout)[1])
    assert ended - entered <= HANG_TIMEOUT_S + 10  # not gloo's 30 minutes
    verdict = done.stderr.split("ddpkit run: worker rank")[-1]
    assert re.search(r"hang: rank 0 waited \d+ s in all_reduce_sum\(float64\[\]\)", verdict)
    assert "rank 1 has not reached it" in verdict
    assert "time.sleep(3600)" in verdict  # rank 1's own stack shows where it is stuck
    assert "[rank1] ddpkit: rank 1's threads (faulthandler)" in done.stdout  # every rank dumps
    dump = done.stdout.split("rank 1's threads (faulthandler)")[1]
    assert "[rank1]   File" in dump and "sleep_before_collective.py" in dump, dump
    assert processes_running(str(script)) == []


def test_a_rank_that_never_reaches_prepare_model_is_named() -> None:
    # DDP's wrapping broadcasts rank 0's weights: before, rank 0 waited there 30 minutes.
    script = SCRIPTS / "sleep_before_prepare_model.py"
    done = ddpkit_cli("run", "--nproc", "2", "--hang-timeout", str(HANG_TIMEOUT_S), str(script))
    assert done.returncode == 124, done.stderr
    verdict = done.stderr.split("ddpkit run: worker rank")[-1]
    assert re.search(r"hang: rank 0 waited \d+ s in prepare_model\(strategy='ddp'\)", verdict)
    assert "rank 1 has not reached it" in verdict
    assert processes_running(str(script)) == []


def test_a_rank_stuck_inside_a_training_step_is_named_with_its_phase() -> None:
    script = SCRIPTS / "hang_in_step.py"
    done = ddpkit_cli("run", "--nproc", "2", "--hang-timeout", str(HANG_TIMEOUT_S), str(script))
    assert done.returncode == 124, done.stderr
    verdict = done.stderr.split("ddpkit run: worker rank")[-1]
    assert re.search(r"rank 0 waited \d+ s in step 3: backward \+ gradient all-reduce", verdict)
    assert "rank 1 has not reached it" in verdict
    assert "rank 1: step 3: forward" in verdict
    assert "loss_that_stalls_on_rank_1" in verdict
    # a warm worker's stack starts at the script, as a fresh one's does
    assert "forkserver.py" not in verdict and 'File "<string>"' not in verdict, verdict
    assert re.search(r"gathered 2 of 2 ranks. states from the store \([\d,]+ bytes", verdict)
    assert processes_running(str(script)) == []


def test_debug_collectives_names_the_ranks_and_shapes_that_disagree() -> None:
    script = SCRIPTS / "mismatched_collective.py"
    done = ddpkit_cli("run", "--nproc", "2", "--debug-collectives", str(script))
    assert done.returncode == 1
    assert "CollectiveMismatchError: collective mismatch at call #0: rank 0 calls ALLREDUCE [3]" \
        " Float, rank 1 calls ALLREDUCE [4] Float (shapes: 3vs 4)" in done.stderr  # fmt: skip
    assert processes_running(str(script)) == []
