"""ddpkit bench's arithmetic, argument splitting and chart fallback (no processes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ddpkit.cli import build_parser, parse
from ddpkit.reporting import METRICS_ENV, read_reports, report
from ddpkit.tools.bench.report import write_charts, write_results
from ddpkit.tools.bench.runner import (
    BenchConfig,
    RunRecord,
    command_for,
    oversubscription_warning,
    summarize,
)


def bench_args(*argv: str):
    return parse(["bench", *argv])


def test_bench_options_may_follow_the_script_and_the_rest_goes_to_it() -> None:
    args = bench_args("train.py", "--lr", "0.1", "--workers", "1,2", "--epochs", "3")
    assert args.workers == (1, 2) and args.script == "train.py"
    assert args.script_args == ["--lr", "0.1", "--epochs", "3"]


def test_after_a_double_dash_everything_is_the_scripts() -> None:
    args = bench_args("--repeat", "3", "train.py", "--", "--workers", "8")
    assert args.repeat == 3 and args.workers == (1, 2, 4)
    assert args.script_args == ["--workers", "8"]


def test_bad_worker_lists_are_refused(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--workers", "1,two", "train.py"])
    assert "'1,two' is not a list like 1,2,4" in capsys.readouterr().err


def runs(times: dict[int, list[float]]) -> list[RunRecord]:
    return [
        RunRecord(w, r, t + 3.0, [{"loss": 1.0 / w, "time_s": t, "samples": 100.0}])
        for w, ts in times.items()
        for r, t in enumerate(ts)
    ]


def test_speedup_and_efficiency_use_the_median_training_time() -> None:
    rows = summarize(runs({1: [8.0, 9.0, 7.0], 2: [5.0, 4.0, 4.5], 4: [4.0, 4.0, 4.0]}))
    assert [r["train_s"] for r in rows] == [8.0, 4.5, 4.0]
    assert [r["speedup"] for r in rows] == [1.0, pytest.approx(1.7778), 2.0]
    assert [r["efficiency"] for r in rows] == [1.0, pytest.approx(0.8889), 0.5]


def test_without_a_one_worker_run_the_smallest_size_is_the_baseline() -> None:
    rows = summarize(runs({2: [6.0], 4: [4.0]}))
    assert rows[1]["speedup"] == 1.5 and rows[1]["efficiency"] == 0.75  # 1.5x for 2x workers


def test_oversubscription_is_named() -> None:
    assert oversubscription_warning((1, 2), 1, 2, 0) is None
    assert "need 4 cores and this machine has 2" in str(oversubscription_warning((1, 4), 1, 2, 0))
    assert "4 workers share 2 GPU(s)" in str(oversubscription_warning((1, 4), 1, 64, 2))


def test_the_baseline_is_a_plain_process() -> None:
    config = BenchConfig("train.py", ("--epochs", "1"))
    assert command_for(config, 1) == [sys.executable, "train.py", "--epochs", "1"]
    assert command_for(config, 4)[1:6] == ["-m", "ddpkit", "run", "--nproc", "4"]


def test_charts_are_skipped_with_a_message_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    summary = {"rows": summarize(runs({1: [2.0], 2: [1.0]}))}
    assert "matplotlib is not installed" in str(write_charts(summary, tmp_path))
    written = write_results(summary, tmp_path)  # the rest is still written
    assert [p.name for p in written] == ["results.json", "results.csv", "results.md"]


def test_reports_go_to_the_metrics_file_only_inside_bench(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.jsonl"
    report("epoch", epoch=1, loss=0.5, time_s=1.0, samples=10)  # no file set: nothing
    monkeypatch.setenv(METRICS_ENV, str(path))
    report("setup", world_size=1)
    report("epoch", epoch=1, loss=0.5, time_s=1.0, samples=10)
    assert [r["kind"] for r in read_reports(path)] == ["setup", "epoch"]
