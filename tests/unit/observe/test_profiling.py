"""Profiling a window of steps: the spec, the flags, merging traces, the clocks, the summary,
and a world of one profiled through the Trainer (no processes)."""

from __future__ import annotations

import argparse
import csv
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import ddpkit
from ddpkit._core.protocol import CLOCK_SKEW_ENV
from ddpkit._core.stepwindow import parse_ranks
from ddpkit.errors import ConfigError
from ddpkit.launch.profileflags import add_profile_arguments, profile_settings
from ddpkit.observe.profiling import chrometrace, clocksync
from ddpkit.observe.profiling import summary as profilesummary
from ddpkit.observe.profiling.profiler import RankProfiler, _chosen_ranks, profile_folder
from ddpkit.observe.profiling.spec import ProfileSpec
from ddpkit.observe.ranktimes import RankTimes
from ddpkit.observe.steptime import Phase, StepClock


def test_a_window_is_read_from_its_text() -> None:
    assert ProfileSpec.parse("200-205").describe() == "steps 200-205 on every rank"
    assert (ProfileSpec.parse("40").first, ProfileSpec.parse("40").last) == (40, 44)
    assert ProfileSpec.parse("").describe() == "steps 11-15 on every rank"  # after warm-up
    assert (
        ProfileSpec.parse("3-4", ranks="slow")
        .describe()
        .endswith("the slow rank and the median rank")
    )
    assert parse_ranks("3,0") == (0, 3)


@pytest.mark.parametrize(
    ("steps", "ranks", "says"),
    [
        ("ten", "all", "is not a window of steps"),
        ("9-3", "all", "ends before it starts"),
        ("0-3", "all", "start at 1"),
        ("1-3", "fast", "give 'all', 'slow'"),
    ],
)
def test_a_bad_window_is_refused_with_the_fix(steps: str, ranks: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        ProfileSpec.parse(steps, ranks)


def test_the_run_flags_reach_the_workers_and_a_typo_stops_at_the_command_line() -> None:
    parser = argparse.ArgumentParser()
    add_profile_arguments(parser)
    args = parser.parse_args(
        ["--profile", "--profile-stacks", "--profile-max-mb", "5", "--profile-memory"]
    )
    settings = profile_settings(args)
    assert settings == {
        "DDPKIT_PROFILE": "",
        "DDPKIT_PROFILE_STACKS": "1",
        "DDPKIT_PROFILE_MEMORY": "1",
        "DDPKIT_PROFILE_MAX_MB": "5.0",
    }
    spec = ProfileSpec.from_environment(settings)
    assert spec is not None and (spec.first, spec.stacks, spec.memory, spec.max_mb) == (
        11,
        True,
        True,
        5.0,
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["--profile", "steps-3"])
    with pytest.raises(argparse.ArgumentTypeError, match=r"write --profile 11-15 train\.py"):
        parser._option_string_actions["--profile"].type("train.py")  # type: ignore[misc, operator]
    assert ProfileSpec.from_environment({}) is None


def test_a_trainer_refuses_a_bad_profile_before_training() -> None:
    ddpkit.init(hang_timeout=0)
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ConfigError, match="profile must be a window"):
        ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.mse_loss, profile=5)


def trace(base_ns: int, *events: dict[str, Any]) -> dict[str, Any]:
    return {"baseTimeNanoseconds": base_ns, "traceEvents": list(events)}


def test_merging_puts_each_rank_on_its_track_and_rank_0s_clock() -> None:
    op = {
        "ph": "X",
        "cat": "cpu_op",
        "name": "aten::mm",
        "pid": 41,
        "tid": 41,
        "ts": 100.0,
        "dur": 5.0,
    }
    flow = {
        "ph": "s",
        "cat": "fwdbwd",
        "name": "fwdbwd",
        "pid": 41,
        "tid": 41,
        "ts": 100.0,
        "id": 7,
    }
    own_name = {"ph": "M", "name": "process_name", "pid": 41, "tid": 0, "args": {"name": "python"}}
    # rank 1's base is 1 ms later and its clock 3 ms ahead: its op ran 2 ms before rank 0's
    merged = chrometrace.merge(
        [
            chrometrace.TraceOf(1, "b", trace(1_000_000, op, flow, own_name), 3_000_000),
            chrometrace.TraceOf(0, "a", trace(0, op, flow, own_name), 0),
        ]
    )
    ops = {e["pid"]: e["ts"] for e in merged["traceEvents"] if e["ph"] == "X"}
    assert ops[0] - ops[1] == pytest.approx(2000.0)
    names = [e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "process_name"]
    assert names == ["rank 0 (a)", "rank 1 (b)"]  # torch's own "python" names are gone
    assert sorted(e["id"] for e in merged["traceEvents"] if e["ph"] == "s") == ["0:7", "1:7"]
    assert merged["ddpkit"]["ranks"]["1"] == {"host": "b", "clock_offset_us": 3000.0}


def test_the_cap_drops_the_shortest_operators_and_keeps_the_phases() -> None:
    ops = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "ts": i, "dur": i} for i in range(200)]
    phase = chrometrace.phase_events([("compute", 1, 0, 10**6)], 1, {})
    kept = trace(0, *ops, *phase)
    dropped = chrometrace.cap(kept, 4000)
    assert dropped > 100 and chrometrace.size_of(kept) <= 4000
    durations = [e["dur"] for e in kept["traceEvents"] if e.get("cat") == "cpu_op"]
    assert min(durations) == 200 - len(durations)  # the longest stayed
    assert any(e.get("cat") == "ddpkit" for e in kept["traceEvents"])


def test_the_clock_offset_comes_from_the_quickest_round() -> None:
    samples = clocksync.ClockSamples()
    samples.add(sent_ns=0, answer_ns=9_000, heard_ns=4_000)  # slow round: says -7 µs
    samples.add(sent_ns=10_000, answer_ns=15_100, heard_ns=10_200)  # quick: -5 µs
    assert samples.best() == -5_000


def test_ranks_ask_rank_0_the_time_through_a_store(monkeypatch: pytest.MonkeyPatch) -> None:
    store = dist.HashStore()
    found: dict[int, int] = {}

    def rank(number: int) -> None:
        found[number] = clocksync.measure_offset(store, number, [0, 1, 2], "t")

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert found[0] == 0 and abs(found[1]) < 5_000_000 and abs(found[2]) < 5_000_000
    monkeypatch.setenv(CLOCK_SKEW_ENV, "2.5")
    assert clocksync.skew_ns() == 2_500_000


def phase(name: str, step: int, start_ms: float, end_ms: float) -> tuple[str, int, int, int]:
    return (name, step, int(start_ms * 1e6), int(end_ms * 1e6))


def profile_of(rank: int, sleep_ms: float) -> profilesummary.RankProfile:
    """Two steps: 1 ms of data, 4 ms of operators then ``sleep_ms`` of Python, 1 ms of sync."""
    phases, events = [], []
    for step, t in ((1, 0.0), (2, 100.0)):
        compute_end = t + 1 + 4 + sleep_ms
        phases += [phase("data", step, t, t + 1), phase("compute", step, t + 1, compute_end),
                   phase("sync", step, compute_end, compute_end + 1)]  # fmt: skip
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "tid": 5,
                "ts": (t + 1) * 1000,
                "dur": 4000,
            }
        )
        events.append({"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "tid": 9,
                       "ts": compute_end * 1000, "dur": 800})  # fmt: skip
    return profilesummary.rank_profile(rank, "h", phases, events, 5, base_us=0.0)


def test_a_ranks_window_is_summed_per_step() -> None:
    slow = profile_of(1, sleep_ms=30)
    assert slow.steps == 2 and slow.phase_ms["compute"] == pytest.approx(34)
    assert slow.python_ms == pytest.approx(30)  # compute not inside an operator
    assert slow.collectives_ms == pytest.approx(0.8)
    assert slow.top_operators[0] == ("aten::mm", 4.0)
    again = profilesummary.RankProfile.from_json(json.loads(json.dumps(slow.to_json())))
    assert again == slow


def test_the_summary_names_the_slow_rank_as_the_straggler_report_would(tmp_path: Path) -> None:
    profiles = [profile_of(0, 0), profile_of(1, 30), profile_of(2, 0)]
    slow = profilesummary.slow_rank(profiles)
    assert slow is not None and slow.rank == 1 and slow.phase.value == "compute"
    text = profilesummary.summary_text(profiles, "steps 1-2")
    assert "slow: rank 1 is" in text and "runs in no torch operator" in text
    assert profilesummary.slow_rank([profile_of(0, 0), profile_of(1, 0)]) is None
    profilesummary.write_csv(tmp_path / "s.csv", profiles)
    with (tmp_path / "s.csv").open() as table:
        rows = list(csv.DictReader(table))
    assert [row["rank"] for row in rows] == ["0", "1", "2"] and rows[1]["python_ms"] == "30.0"
    pytest.importorskip("matplotlib")
    assert profilesummary.draw(tmp_path / "s.png", profiles, "steps 1-2") is None
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def fit(tmp_path: Path, profile: str, epochs: int = 1) -> ddpkit.Trainer:
    ddpkit.init(hang_timeout=0)
    data = TensorDataset(torch.randn(32, 3), torch.randn(32, 1))
    model = ddpkit.prepare_model(torch.nn.Linear(3, 1))
    trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.mse_loss,
                             log_dir=tmp_path / "logs", profile=profile)  # fmt: skip
    trainer.fit(DataLoader(data, batch_size=4), epochs=epochs)
    return trainer


def test_a_world_of_one_writes_its_window_beside_the_logs(tmp_path: Path) -> None:
    fit(tmp_path, "2-3")
    folder = tmp_path / "logs" / "profile" / "steps-2-3"
    merged = json.loads((folder / "merged.json").read_text())
    assert {e["pid"] for e in merged["traceEvents"]} == {0}
    steps = {e["args"]["step"] for e in merged["traceEvents"] if e.get("cat") == "ddpkit"}
    assert steps == {2, 3}
    assert (folder / "summary.csv").exists() and len(list(folder.glob("ranks/*-rank0.json"))) == 1


def test_a_run_that_ends_inside_its_window_writes_what_it_profiled(tmp_path: Path) -> None:
    fit(tmp_path, "7-100")  # 8 steps in the run
    merged = json.loads((tmp_path / "logs" / "profile" / "steps-7-100" / "merged.json").read_text())
    steps = {e["args"]["step"] for e in merged["traceEvents"] if e.get("cat") == "ddpkit"}
    assert {7, 8} <= steps and max(steps) <= 9


def test_python_calls_and_record_function_ranges_are_timed_apart() -> None:
    def event(cat: str, name: str, ts: float, dur: float) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}

    events = [
        event("python_function", "model.py(9): forward", 0, 100),
        event("python_function", "profiler.py(918): __enter__", 3, 5),
        event("user_annotation", "DistributedDataParallel.forward", 5, 90),  # opens in __enter__
        event("python_function", "<built-in function sleep>", 10, 80),
    ]
    calls = profilesummary.self_times(events, {"python_function"})
    assert calls == {
        "model.py(9): forward": 15.0,
        "profiler.py(918): __enter__": 5.0,
        "<built-in function sleep>": 80.0,
    }
    assert profilesummary.self_times(events, {"user_annotation"}) == {
        "DistributedDataParallel.forward": 90.0
    }


def times_of(work_ms: list[float]) -> RankTimes:
    ms = [{phase: (w if phase is Phase.COMPUTE else 0.0) for phase in Phase} for w in work_ms]
    return RankTimes(ms, work_ms, [300.0] * len(work_ms), ["a"] * len(work_ms))


def test_slow_ranks_are_the_straggler_and_the_median_other() -> None:
    ddpkit.init(hang_timeout=0)
    slow = ProfileSpec.parse("5-6", ranks="slow")
    assert _chosen_ranks(slow, times_of([10, 11, 40, 12]), 4) == [1, 2]
    assert _chosen_ranks(slow, times_of([10, 11, 12, 12]), 4) == [0, 1, 2, 3]  # none named
    assert _chosen_ranks(slow, None, 2) == [0, 1]
    assert _chosen_ranks(ProfileSpec.parse("5-6", ranks="1,7"), None, 4) == [1]


def test_a_request_opens_a_window_at_the_next_step_once(tmp_path: Path) -> None:
    ddpkit.init(hang_timeout=0)
    profiler = RankProfiler(None, StepClock([], torch.device("cpu")), tmp_path)
    assert not profiler.asked()
    (tmp_path / "request").touch()
    assert profiler.asked() and not (tmp_path / "request").exists()  # taken
    profiler.requested(step=40)
    assert profiler.spec is not None and (profiler.spec.first, profiler.spec.last) == (41, 45)


def test_a_profile_that_cannot_be_written_leaves_the_training_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DDPKIT_PROFILE_DIR", str(blocker))
    trainer = fit(tmp_path, "2-3")
    assert trainer.step == 8  # the whole epoch trained
    assert "could not write its trace" in caplog.text and "training goes on" in caplog.text


def test_under_a_ddpkit_tool_profiles_go_to_its_scratch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDPKIT_LOG_DIR", str(tmp_path / "scratch"))
    assert profile_folder("runs/x").is_relative_to(tmp_path / "scratch")
    assert profile_folder(None).is_relative_to(tmp_path / "scratch")
    monkeypatch.delenv("DDPKIT_LOG_DIR")
    assert profile_folder(None) == Path("ddpkit-profile").absolute()
