"""Profiling a window of steps on a real 2-worker job: one timeline, aligned, and summarised.

tests/scripts/profiled.py slows rank 1 by a 30 ms sleep in its forward and, in the first
job, moves rank 1's wall clock 250 ms ahead (its trace is written on that clock). One job
(``ddpkit run --profile 5-8``) carries every check of the window: each rank's file within
the size cap with the metadata analysis tools read, one merged trace with a track per rank,
the sleep in rank 1's track and the summary naming rank 1, and the 250 ms found and taken
out. The second job is asked for a profile while it runs, by the request file. A third, short
one runs with ``--profile-stacks`` and ``--profile-memory``: the summary names rank 1's Python
calls (the sleep) and each rank's trace holds torch's allocation timeline.
"""

from __future__ import annotations

import csv
import json
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from helpers.launch_helpers import REPO, SCRIPTS, ddpkit_cli

# timed (a sleep must show; round trips through the store bound the clock's error): alone
pytestmark = [pytest.mark.multiproc, pytest.mark.serial]

HOST = socket.gethostname()
Phase = tuple[float, float]  # (first start, total duration), µs
CAP_MB = 0.15
SKEW_MS = 250.0
SLOW_MS = 30.0


@pytest.fixture(scope="module")
def window(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp("profiled")
    done = ddpkit_cli(
        "run", "--nproc", "2", "--profile", "5-8", "--profile-max-mb", str(CAP_MB),
        "--profile-dir", str(out / "profile"), str(SCRIPTS / "profiled.py"), str(out), "16",
        str(SLOW_MS), "--skew-ms", str(SKEW_MS), timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr, out / "profile" / "steps-5-8"


def phases(events: list[dict[str, Any]], name: str, pid: int | None = None) -> dict[int, Phase]:
    """ddpkit's phase ``name`` in each step (of process ``pid`` when given): when it first
    began and how long it took in all (a step's compute comes in pieces around its sync)."""
    found: dict[int, Phase] = {}
    for e in events:
        if e.get("cat") == "ddpkit" and e["name"] == name and pid in (None, e["pid"]):
            start, took = found.get(e["args"]["step"], (e["ts"], 0.0))
            found[e["args"]["step"]] = (min(start, e["ts"]), took + e["dur"])
    return found


def test_each_rank_writes_a_capped_trace_named_by_host_and_rank(window: tuple[str, Path]) -> None:
    _, folder = window
    for rank in (0, 1):
        path = folder / "ranks" / f"{HOST}-rank{rank}.json"
        assert path.stat().st_size <= CAP_MB * 2**20
        text = path.read_text()
        trace = json.loads(text)
        assert trace["distributedInfo"]["rank"] == rank  # what HTA groups ranks by ...
        assert re.search(r'"rank":\s+(\d+)', text)[1] == str(rank)  # ... found by this pattern
        assert trace["distributedInfo"]["world_size"] == 2
        assert trace["ddpkit"]["host"] == HOST and trace["ddpkit"]["steps"] == [5, 8]
        assert trace["ddpkit"]["dropped_events"] > 0  # the cap was reached: it cut
        assert sorted(phases(trace["traceEvents"], "optimizer")) == [5, 6, 7, 8]
        marks = {e["name"] for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep#")}
        assert marks == {f"ProfilerStep#{step}" for step in (5, 6, 7, 8)}  # HTA's iterations


def test_one_merged_trace_holds_a_track_per_rank(window: tuple[str, Path]) -> None:
    _, folder = window
    merged = json.loads((folder / "merged.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}  # fmt: skip
    assert names == {0: f"rank 0 ({HOST})", 1: f"rank 1 ({HOST})"}
    for rank in (0, 1):
        mine = [e for e in merged["traceEvents"] if e["pid"] == rank and e["ph"] == "X"]
        assert any(e["name"] == "gloo:all_reduce" for e in mine)  # DDP's gradient buckets
        assert any(e["name"].startswith("aten::") for e in mine)
        assert sorted(phases(mine, "compute")) == [5, 6, 7, 8]


def test_the_sleeping_rank_shows_in_its_track_and_is_named(window: tuple[str, Path]) -> None:
    output, folder = window
    merged = json.loads((folder / "merged.json").read_text())["traceEvents"]
    for step in (5, 6, 7, 8):  # rank 1's compute holds the sleep; rank 0 waits in sync
        assert phases(merged, "compute", 1)[step][1] >= 0.9 * SLOW_MS * 1000
        assert phases(merged, "sync", 0)[step][1] >= 0.5 * SLOW_MS * 1000
    [slow] = [line for line in output.splitlines() if "slow: rank" in line]
    assert "slow: rank 1 is" in slow and "ms per step computing" in slow
    assert "runs in no torch operator" in slow  # a sleep is Python, not an operator
    with (folder / "summary.csv").open() as table:
        rows = {row["rank"]: row for row in csv.DictReader(table)}
    assert float(rows["1"]["python_ms"]) >= 0.9 * SLOW_MS > float(rows["0"]["python_ms"])
    assert float(rows["0"]["sync_ms"]) > float(rows["1"]["sync_ms"])
    assert (folder / "summary.png").stat().st_size > 0


def test_a_clock_running_ahead_is_found_and_taken_out(window: tuple[str, Path]) -> None:
    _, folder = window
    merged = json.loads((folder / "merged.json").read_text())
    offset_us = merged["ddpkit"]["ranks"]["1"]["clock_offset_us"]
    assert abs(offset_us - SKEW_MS * 1000) < 1000  # within 1 ms of the injected 250 ms
    # The steps' optimizer phases start as the all-reduce ends on both ranks: 250 ms apart
    # in the ranks' own files, together (within the machine's noise) in the merged one.
    raw = [json.loads((folder / "ranks" / f"{HOST}-rank{r}.json").read_text()) for r in (0, 1)]
    starts = [
        {
            s: ts + t["baseTimeNanoseconds"] / 1000
            for s, (ts, _) in phases(t["traceEvents"], "optimizer").items()
        }
        for t in raw
    ]
    apart = statistics.median(starts[1][s] - starts[0][s] for s in starts[0]) / 1000
    assert apart == pytest.approx(SKEW_MS, abs=5)
    opt = [phases(merged["traceEvents"], "optimizer", r) for r in (0, 1)]
    together = statistics.median(abs(opt[1][s][0] - opt[0][s][0]) for s in opt[0]) / 1000
    assert together < 5


def test_a_running_job_is_profiled_on_request(tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    command = [sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "--profile-dir",
               str(profile), str(SCRIPTS / "profiled.py"), str(tmp_path), "400", "0",
               "--log-every", "5"]  # fmt: skip
    job = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (tmp_path / "running").exists() and job.poll() is None:
        assert time.monotonic() < deadline, "the job never reached step 10"
        time.sleep(0.1)
    profile.mkdir(exist_ok=True)
    (profile / "request").touch()
    output, _ = job.communicate(timeout=180)
    assert job.returncode == 0, output
    assert "on request" in output
    [folder] = profile.glob("steps-*")
    first = int(folder.name.split("-")[1])
    assert first > 10  # the window came after the request, in the same run
    merged = json.loads((folder / "merged.json").read_text())
    assert set(merged["ddpkit"]["ranks"]) == {"0", "1"}
    assert not (profile / "request").exists()  # taken: it asks once


@pytest.fixture(scope="module")
def detailed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A short job with both flags; its own launch, uncapped and unskewed: stacks and memory
    records would break the first job's size cap and timing checks."""
    out = tmp_path_factory.mktemp("detailed")
    done = ddpkit_cli(
        "run", "--nproc", "2", "--profile", "3-5", "--profile-stacks", "--profile-memory",
        "--profile-dir", str(out / "profile"), str(SCRIPTS / "profiled.py"), str(out), "6",
        str(SLOW_MS), timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr, out / "profile" / "steps-3-5"


@pytest.mark.timeout(240)
def test_stacks_name_the_slow_ranks_python_calls(detailed: tuple[str, Path]) -> None:
    output, _ = detailed
    [slow] = [line for line in output.splitlines() if "slow: rank" in line]
    assert "slow: rank 1 is" in slow
    # only Python stacks (torch's python_function events) can name the sleep itself
    calls = re.search(r"its Python calls by self time per step: <built-in function sleep> "
                      r"([\d.]+) ms", slow)  # fmt: skip
    assert calls, slow
    assert float(calls[1]) >= 0.9 * SLOW_MS


@pytest.mark.timeout(240)
def test_memory_puts_an_allocation_timeline_in_each_ranks_trace(
    detailed: tuple[str, Path],
) -> None:
    _, folder = detailed
    for rank in (0, 1):
        trace = json.loads((folder / "ranks" / f"{HOST}-rank{rank}.json").read_text())
        # torch's profile_memory records: an instant event per allocation and per free
        memory = [e["args"] for e in trace["traceEvents"] if e.get("name") == "[memory]"]
        assert memory, f"rank {rank}'s trace has no [memory] events"
        assert all({"Total Allocated", "Bytes"} <= set(args) for args in memory)
        assert any(a["Bytes"] > 0 for a in memory) and any(a["Bytes"] < 0 for a in memory)
