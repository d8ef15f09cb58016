"""What keeping every step in memory costs: ``examples/gpt.py`` on 2 workers under ``ddpkit
run --max-restarts 1``, with its memory snapshots (the default there) and with
``--no-memory-snapshots``, strictly alternating in one run.

Each run's step time is the median of its epochs' ``ms/step`` after the first (warm-up); a
round's ratio is with / without; the median ratio over rounds is the cost. Nothing fails: this
is what a job pays for a restart that loses no step.

    GLOO_SOCKET_IFNAME=lo .venv/bin/python benchmarks/snapshot_cost.py --repeat 5

``--within PAIRS``: one job instead (benchmarks/snapshot_cost_job.py, the same example with a
callback), whose epochs after the first come in pairs, one with snapshots and one without, in
A-B, B-A order: the same processes, so the machine's drift between runs (wider here than the
cost) does not enter. Each pair's ratio is with / without; the median is the cost.

    GLOO_SOCKET_IFNAME=lo .venv/bin/python benchmarks/snapshot_cost.py --within 6

``--steps EPOCHS``: one job whose snapshots alternate step by step after the first epoch;
each epoch's ratio is the median step after a snapshot over the median step after none (a
step after a snapshot carries that snapshot's copying). Run to run, and even epoch to epoch,
this machine's step time moves by more than the cost; step to step it moves on both alike.

    GLOO_SOCKET_IFNAME=lo .venv/bin/python benchmarks/snapshot_cost.py --steps 6
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

EXAMPLE = str(Path(__file__).parent.parent / "examples" / "gpt.py")
ALTERNATING = str(Path(__file__).with_name("snapshot_cost_job.py"))
STEP_MS = re.compile(r"epoch \d+/\d+ .*?; ([\d.]+) ms/step")
EPOCH_MS = re.compile(r"epoch (\d+)/\d+ .*?; ([\d.]+) ms/step")
SAID = re.compile(r"snapshots (on|off) for epoch (\d+)")
STEPS_SAID = re.compile(r"epoch (\d+): steps with ([\d.]+) ms, without ([\d.]+) ms")
TAKEN = re.compile(r"snapshot: median ([\d.]+) ms a step")
RUN = [sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "--max-restarts", "1"]
WAYS = {"snapshots": [], "none": ["--no-memory-snapshots"]}


def step_ms(flags: list[str], epochs: int) -> float:
    """The median ms/step of one run's epochs after the first."""
    done = subprocess.run([*RUN, *flags, EXAMPLE, "--epochs", str(epochs)],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the run failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    times = [float(ms) for ms in STEP_MS.findall(done.stdout + done.stderr)]
    if len(times) < 2:
        raise SystemExit(f"no epoch lines in:\n{done.stdout}{done.stderr}")
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="rounds, each way once a round")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--within", type=int, metavar="PAIRS",
                        help="one job, PAIRS pairs of epochs with and without")  # fmt: skip
    parser.add_argument(
        "--steps",
        type=int,
        metavar="EPOCHS",
        help="one job, snapshots alternating step by step for EPOCHS epochs",
    )
    args = parser.parse_args()
    if args.steps:
        return step_by_step(args.steps)
    if args.within:
        return within_one_run(args.within)
    ratios, seen = [], {way: [] for way in WAYS}
    for round_ in range(args.repeat):
        order = list(WAYS) if round_ % 2 == 0 else list(reversed(WAYS))  # alternate who is first
        now = {way: step_ms(WAYS[way], args.epochs) for way in order}
        for way, ms in now.items():
            seen[way].append(ms)
        ratios.append(now["snapshots"] / now["none"])
        print(f"round {round_ + 1}: with {now['snapshots']:.2f} ms/step, without "
              f"{now['none']:.2f}: {ratios[-1]:.3f}", flush=True)  # fmt: skip
    print(f"memory snapshots every step: with / without, median of {len(ratios)} rounds "
          f"{statistics.median(ratios):.3f} (lowest {min(ratios):.3f}, highest {max(ratios):.3f}); "
          f"with {statistics.median(seen['snapshots']):.2f} ms/step, without "
          f"{statistics.median(seen['none']):.2f}")  # fmt: skip


def within_one_run(pairs: int) -> None:
    """One job, epochs in pairs with and without snapshots: the pairs' ratios."""
    done = subprocess.run([*RUN, ALTERNATING, "--epochs", str(2 * pairs + 1)],
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    out = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"the run failed ({done.returncode}):\n{out}")
    on = {int(epoch): state == "on" for state, epoch in SAID.findall(out)}
    ms = {int(epoch): float(value) for epoch, value in EPOCH_MS.findall(out)}
    ratios = []
    for first in range(2, 2 * pairs + 2, 2):
        pair = (first, first + 1)
        with_, without = [ms[e] for e in pair if on[e]], [ms[e] for e in pair if not on[e]]
        ratios.append(with_[0] / without[0])
        print(f"epochs {pair}: with {with_[0]:.2f} ms/step, without {without[0]:.2f}: "
              f"{ratios[-1]:.3f}")  # fmt: skip
    step_ms = statistics.median(ms[e] for e in ms if e > 1 and on[e])
    taken = float(TAKEN.findall(out)[-1])
    print(f"memory snapshots every step, within one run: with / without, median of "
          f"{len(ratios)} pairs {statistics.median(ratios):.3f} (lowest {min(ratios):.3f}, "
          f"highest {max(ratios):.3f}); timed inside: rank 0's snapshot {taken:.2f} ms of a "
          f"{step_ms:.1f} ms step ({taken / step_ms:.1%})")  # fmt: skip


def step_by_step(epochs: int) -> None:
    """One job, snapshots at every other step: each epoch's ratio of the median steps."""
    env = {**os.environ, "SNAPSHOT_COST_STEPS": "1"}
    done = subprocess.run([*RUN, ALTERNATING, "--epochs", str(epochs + 1)], env=env,
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    out = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"the run failed ({done.returncode}):\n{out}")
    ratios = []
    for epoch, with_, without in STEPS_SAID.findall(out):
        ratios.append(float(with_) / float(without))
        print(f"epoch {epoch}: steps after a snapshot {float(with_):.2f} ms, after none "
              f"{float(without):.2f}: {ratios[-1]:.3f}")  # fmt: skip
    if not ratios:
        raise SystemExit(f"no step times in:\n{out}")
    print(f"memory snapshots every step, step by step in one run: with / without, median of "
          f"{len(ratios)} epochs {statistics.median(ratios):.3f} (lowest {min(ratios):.3f}, "
          f"highest {max(ratios):.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
