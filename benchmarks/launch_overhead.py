"""Launch-to-exit time of a 2-worker no-op job: `ddpkit run` vs `torchrun --standalone`.

Runs alternate (ddpkit, warm ddpkit, torchrun, ...) so machine noise hits all alike; the
medians and their ratios are printed. Target: ratio <= 1.0 (ddpkit no slower). The warm
variant, ``ddpkit run``'s default, runs the script in function workers forked from a server
that imports torch once; ``--fresh-workers`` gives each worker a ``python`` of its own.

    .venv/bin/python benchmarks/launch_overhead.py --repeat 7
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

NOOP = str(Path(__file__).with_name("noop_job.py"))
COMMANDS = {
    "ddpkit run --fresh-workers": [
        *(sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "--fresh-workers", NOOP)
    ],
    "ddpkit run (warm workers)": [sys.executable, "-m", "ddpkit", "run", "--nproc", "2", NOOP],
    "torchrun --standalone": [
        *(sys.executable, "-m", "torch.distributed.run"),
        *("--standalone", "--nproc-per-node", "2", NOOP),
    ],
}


def time_once(command: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{command} failed:\n{done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeat):
        for name, command in COMMANDS.items():
            times[name].append(time_once(command))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        runs = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:24s} median {medians[name]:.2f} s  (runs: {runs})")
    for name in ("ddpkit run --fresh-workers", "ddpkit run (warm workers)"):
        ratio = medians[name] / medians["torchrun --standalone"]
        print(f"ratio {name} / torchrun: {ratio:.3f}  (target <= 1.0)")


if __name__ == "__main__":
    main()
