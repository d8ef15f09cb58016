"""The benchmarks in benchmarks/ run end to end in a tiny configuration (smoke only: no speed
figures are asserted here; they are measured side by side by the benchmarks themselves)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers.launch_helpers import REPO

pytestmark = pytest.mark.multiproc


def run_benchmark(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


@pytest.mark.timeout(320)
def test_parity_benchmark_reports_every_variant() -> None:
    # One workload (the one with every variant): the cnn one differs only in its model; the
    # compiled variant is compile=True on the same path (tests/multiproc/parallel/test_compile).
    variants = "single,independent,raw,ddpkit,ddpkit step,ddpkit loop,ddpkit tuned"
    out = run_benchmark("benchmarks/parity.py", "--tiny", "--workloads", "mlp",
                        "--variants", variants)  # fmt: skip
    for row in ("| mlp | single |", "| mlp | raw |", "| mlp | ddpkit |", "| mlp | ddpkit tuned |"):
        assert row in out
    rows = [line.split("|") for line in out.splitlines() if "| ddpkit" in line]
    ratios = [
        row[column].strip() for row in rows for column in (4, 5, 6)
    ]  # median, paired, fastest
    assert all(float(r) > 0 for r in ratios)


@pytest.mark.timeout(200)
def test_loop_parity_benchmark_pairs_the_two_loops_in_the_same_workers() -> None:
    out = run_benchmark("benchmarks/loop_parity.py", "--rounds", "2", "--workloads", "mlp,gpt",
                        "--samples", "512")  # fmt: skip
    for workload, batch in (("mlp", 64), ("gpt", 16)):  # gpt: examples/gpt.py, dict batches
        line = rf"{workload} \(batch {batch}\): TrainLoop / hand-written, median of the rounds' "
        ratio = re.search(line + r"ratios ([\d.]+)", out)
        assert ratio and float(ratio.group(1)) > 0, out


@pytest.mark.timeout(200)
def test_loop_parts_benchmark_times_each_part_of_both_loops() -> None:
    out = run_benchmark("benchmarks/loop_parts.py", "--workload", "mlp", "--rounds", "2",
                        "--samples", "512")  # fmt: skip
    for part in ("hand fetch", "loop fetch", "hand update", "loop backward", "loop update"):
        timed = re.search(rf"^  {part} +([\d.]+)$", out, re.MULTILINE)
        assert timed and float(timed.group(1)) > 0, out
    assert re.search(r"the loop's own time a step: -?[\d.]+ us \(fetch", out), out


@pytest.mark.timeout(200)
def test_restart_cost_times_the_gpt_example_to_its_first_step_under_every_launcher() -> None:
    out = run_benchmark("benchmarks/restart_cost.py", "--repeat", "1", "--jobs", "gpt")
    # not torchrun's rows: its runs may fail here
    for launcher in ("ddpkit run --fresh-workers", "ddpkit run (warm workers)"):
        row = next(line for line in out.splitlines() if line.startswith(launcher))
        ended = re.search(r"gpt: launch to exit ([\d.]+) s", row)
        stepped = re.search(r"gpt: launch to first step ([\d.]+) s", row)
        assert ended and stepped, out
        assert 0 < float(stepped.group(1)) < float(ended.group(1)), out
    assert "torchrun --standalone    gpt: launch to exit" in out


@pytest.mark.timeout(320)
def test_strategies_benchmark_reports_every_strategy() -> None:
    out = run_benchmark(
        "benchmarks/strategies.py", "--width", "64", "--steps", "2", "--rounds", "1"
    )
    assert "| ddp |" in out and "| fsdp |" in out and "| ddp + bf16 hook |" in out
    assert "| hsdp (shard 1) |" in out  # 2 workers: two replicas of one shard each


@pytest.mark.timeout(320)
def test_activation_memory_benchmark_keeps_less_with_recompute() -> None:
    out = run_benchmark("benchmarks/activation_memory.py", "--blocks", "4", "--width", "64",
                        "--batch", "256", "--steps", "1", "--rounds", "1")  # fmt: skip
    kept = {row.split("|")[1].strip(): row.split("|")[2] for row in out.splitlines()
            if row.startswith("| ddp") or row.startswith("| fsdp")}  # fmt: skip
    mib = {name: float(text.split()[0]) for name, text in kept.items()}
    assert mib["ddp + recompute"] < mib["ddp"] / 2 and mib["fsdp + recompute"] < mib["fsdp"] / 2


@pytest.mark.timeout(320)
def test_watchdog_overhead_benchmark_reports_a_ratio() -> None:
    out = run_benchmark("benchmarks/watchdog_overhead.py", "--rounds", "1", "--batch", "512")
    ratio = float(out.strip().splitlines()[-1].rsplit("ratio ", 1)[1])
    assert ratio > 0


def test_guard_overhead_benchmark_reports_a_ratio() -> None:
    out = run_benchmark("benchmarks/guard_overhead.py", "--workload", "wine", "--rounds", "1")
    ratios = out.strip().splitlines()[-1].removeprefix("ratios: ").split(", ")
    assert [r.split()[0] for r in ratios] == ["error/off", "skip/off"]
    assert all(float(r.split()[1]) > 0 for r in ratios)


def test_stop_latency_benchmark_sees_exit_75() -> None:
    out = run_benchmark("benchmarks/stop_latency.py", "--runs", "1")
    assert out.startswith("exit 75 ") and "stopped by SIGTERM at" in out


def test_checkpoint_cost_benchmark_reports_every_operation() -> None:
    out = run_benchmark("benchmarks/checkpoint_cost.py", "--layers", "1", "--rounds", "1")
    for name in ("digest only", "plain save", "sealed save", "plain load", "checked load"):
        assert name in out
    training = run_benchmark("benchmarks/checkpoint_cost.py", "--training", "--layers", "1",
                             "--rounds", "1")  # fmt: skip
    assert float(training.split("ratio async/sync: fastest")[1].split()[0]) > 0


@pytest.mark.timeout(200)
def test_launch_overhead_benchmark_prints_the_ratio_to_torchrun() -> None:
    out = run_benchmark("benchmarks/launch_overhead.py", "--repeat", "1")
    ratio = float(out.split("ratio ddpkit run --fresh-workers / torchrun:")[1].split()[0])
    warm = float(out.split("ratio ddpkit run (warm workers) / torchrun:")[1].split()[0])
    print(f"launch overhead ddpkit run --fresh-workers / torchrun: {ratio:.3f}, warm (the "
          f"default) {warm:.3f} (one run each; "
          "measure with --repeat 7)")  # fmt: skip
    assert ratio > 0 and warm > 0


@pytest.mark.timeout(120)
def test_import_cost_benchmark_prints_ddpkits_share() -> None:
    out = run_benchmark("benchmarks/import_cost.py", "--repeat", "1")
    extra = float(out.split("ddpkit's training API over torch:")[1].split()[0])
    print(f"ddpkit's training API over torch: {extra:+.3f} s (one run; measure with --repeat 7)")
    assert "import ddpkit" in out and -5 < extra < 5


def test_loop_overhead_benchmark_reports_each_way() -> None:
    out = run_benchmark("benchmarks/loop_overhead.py", "--rounds", "1", "--samples", "256")
    for way in ("plain", "trainer", "loop"):
        assert re.search(rf"{way} +\d+\.\d us/step", out), out


def test_step_times_overhead_benchmark_prints_the_ratio() -> None:
    out = run_benchmark("benchmarks/step_times_overhead.py", "--rounds", "1", "--samples", "512")
    fastest = float(out.split("ratio on/off: fastest")[1].split()[0])
    assert fastest > 0


@pytest.mark.timeout(200)
def test_spawn_start_benchmark_prints_the_ratio_to_the_spawn_method() -> None:
    out = run_benchmark("benchmarks/spawn_start.py", "--rounds", "1")
    assert "first forkserver call (starts the server):" in out
    assert float(out.split("ratio forkserver / spawn:")[1].split()[0]) > 0


@pytest.mark.timeout(200)
def test_meta_start_benchmark_reports_both_ways() -> None:
    out = run_benchmark("benchmarks/meta_start.py", "--width", "64", "--blocks", "2",
                        "--rounds", "1")  # fmt: skip
    assert "| built whole on every rank |" in out and "| meta device + weights file |" in out


def test_scale_launch_benchmark_prints_the_ratio_to_torchrun() -> None:
    out = run_benchmark("benchmarks/scale_launch.py", "--nproc", "2", "--repeat", "1")
    ratio = float(out.split("ratio ddpkit run / torchrun at 2 ranks:")[1].split()[0])
    assert ratio > 0 and "straggler lines without the oversubscription note: 0" in out
