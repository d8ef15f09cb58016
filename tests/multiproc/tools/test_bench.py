"""`ddpkit bench` end to end: the wine example at 1 and 2 workers, as a user runs it."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from helpers.launch_helpers import ddpkit_cli, snapshot

pytestmark = pytest.mark.multiproc


def test_bench_on_wine_writes_table_json_csv_and_charts(
    tmp_path: Path, user_checkpoints: Path
) -> None:
    """Beside an earlier run's checkpoints (3 epochs, more than asked): every bench run trains
    from nothing, the 2-worker run does not resume the 1-worker run, the user's folder stays."""
    before = snapshot(user_checkpoints)
    out = tmp_path / "bench"
    done = ddpkit_cli(
        "bench", "examples/wine.py", "--epochs", "2", "--workers", "1,2", "--out", str(out),
        "--checkpoint-dir", str(user_checkpoints), timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert snapshot(user_checkpoints) == before
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["w1-r1", "w2-r1"]
    assert "| workers | global batch |" in done.stdout
    assert "batch policy: per_device" in done.stdout

    summary = json.loads((out / "results.json").read_text())
    rows = summary["rows"]
    assert [r["workers"] for r in rows] == [1, 2]
    assert [r["global_batch"] for r in rows] == [32, 64]  # per_device: the batch grows
    assert [r["strategy"] for r in rows] == ["none", "ddp"]  # 1 worker: one plain process
    for row in rows:
        assert row["wall_s"] > row["train_s"] > 0 and row["samples_per_s"] > 0
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["workers"], abs=1e-3)
        assert len(row["losses"]) == 2 and row["val_metric"]["name"] == "val_accuracy"
    assert rows[0]["speedup"] == 1.0
    assert sum(r["setup"]["world_size"] for r in summary["runs"]) == 3  # really 1 and 2

    with (out / "results.csv").open() as handle:
        assert [row["workers"] for row in csv.DictReader(handle)] == ["1", "2"]
    for chart in ("duration.png", "loss.png", "breakdown.png"):
        assert (out / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for row in rows:  # where the step's time goes, and the memory, at each size
        assert set(row["step_ms"]) == {"data", "compute", "sync", "optimizer", "other"}
        assert sum(row["step_ms"].values()) > 0 and row["peak_mem_mb"] > 10
    # One process has nothing to wait for: its sync is the timer's own cost (0.06 ms measured
    # once under load), far below two workers' gradient all-reduce.
    assert rows[0]["step_ms"]["sync"] < min(0.2, rows[1]["step_ms"]["sync"] / 2), rows
    assert re.search(r"\| [\d.]+ = [\d.]+ \+ [\d.]+ \+ [\d.]+ \+ [\d.]+ \+ [\d.]+ \| \d+ MB \|",
                     done.stdout)  # fmt: skip


def test_bench_reports_a_failing_script_with_its_output(tmp_path: Path) -> None:
    done = ddpkit_cli(
        "bench", "tests/scripts/crash_on_rank1.py", "--workers", "2", "--out", str(tmp_path),
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "the 2-worker run exited with code 1" in done.stderr
    assert "logs/w2-r1.log" in done.stderr
