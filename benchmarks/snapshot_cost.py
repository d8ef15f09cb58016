"""What keeping every step in memory costs: ``examples/gpt.py`` on 2 workers under ``ddpkit
run --max-restarts 1``, with its memory snapshots (the default there) and with
``--no-memory-snapshots``, strictly alternating in one run.

Each run's step time is the median of its epochs' ``ms/step`` after the first (warm-up); a
round's ratio is with / without; the median ratio over rounds is the cost. Nothing fails: this
is what a job pays for a restart that loses no step.

    GLOO_SOCKET_IFNAME=lo .venv/bin/python benchmarks/snapshot_cost.py --repeat 5
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

EXAMPLE = str(Path(__file__).parent.parent / "examples" / "gpt.py")
STEP_MS = re.compile(r"epoch \d+/\d+ .*?; ([\d.]+) ms/step")
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
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
