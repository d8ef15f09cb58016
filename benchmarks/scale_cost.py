"""What ddpkit itself costs as the world grows, counted, not timed (2 cores cannot time 64
ranks): a tiny Trainer job (benchmarks/scale_cost_job.py) under ``ddpkit run --nproc N`` for
each N, every rank counting; a table of each item against N, and the growth that fits it
best (constant, log N, N, N log N or N squared, by least squares on a + b f(N); a faster
growth must halve the error to be chosen).

Rows: the collectives ddpkit adds per rank and per step (calls, bytes), and per epoch at its
boundary; what rank 0 receives from them per epoch; the set-up's collectives; the keys in the
job's store; the console's lines per epoch (the launcher's output, merged); the open file
descriptors and threads of a worker (the largest); and a hang's report (a second job per N,
tests/scripts/hang_in_step.py: one rank stops mid-step): the ranks' states the reporting
rank reads from the store and their bytes, and the verdict's lines and bytes.

    GLOO_SOCKET_IFNAME=lo .venv/bin/python benchmarks/scale_cost.py              # 2..64
    GLOO_SOCKET_IFNAME=lo .venv/bin/python benchmarks/scale_cost.py --sizes 2,4,8
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

JOB = str(Path(__file__).with_name("scale_cost_job.py"))
HANG_JOB = str(Path(__file__).parents[1] / "tests" / "scripts" / "hang_in_step.py")
HANG_TIMEOUT_S = 10
EPOCH_LINE = re.compile(r"epoch \d+/\d+ ")
GATHERED = re.compile(r"gathered (\d+) of \d+ ranks' states from the store \(([\d,]+) bytes")
GROWTHS: dict[str, Callable[[float], float]] = {
    "constant": lambda n: 0.0,
    "log N": math.log2,
    "N": lambda n: n,
    "N log N": lambda n: n * math.log2(n),
    "N^2": lambda n: n * n,
}


def run(size: int, epochs: int) -> tuple[list[dict[str, Any]], str]:
    """Every rank's counts, and the launcher's output, of the job at world size ``size``."""
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [sys.executable, "-m", "ddpkit", "run", "--nproc", str(size), JOB, folder,
             str(epochs)], capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"N={size} failed ({done.returncode}):\n{done.stdout[-3000:]}"
                             f"{done.stderr[-3000:]}")  # fmt: skip
        ranks = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("rank*.json"))]
    if len(ranks) != size:
        raise SystemExit(f"N={size}: {len(ranks)} ranks wrote their counts")
    return ranks, done.stdout + done.stderr


def hang_rows(size: int) -> dict[str, float]:
    """What one hang's report cost at world size ``size``: states and bytes the reporting
    rank read, and the verdict the launcher printed (its last worker failure)."""
    done = subprocess.run(
        [sys.executable, "-m", "ddpkit", "run", "--nproc", str(size), "--hang-timeout",
         str(HANG_TIMEOUT_S), HANG_JOB], capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    found = GATHERED.search(done.stderr)
    if done.returncode != 124 or found is None:
        raise SystemExit(f"N={size}: the hang job ended {done.returncode} without its report:"
                         f"\n{done.stderr[-3000:]}")  # fmt: skip
    verdict = done.stderr.split("ddpkit run: worker rank")[-1].strip()
    return {
        "hang: states the reporter reads": float(found[1]),
        "hang: bytes the reporter reads": float(found[2].replace(",", "")),
        "hang: verdict lines": float(len(verdict.splitlines())),
        "hang: verdict bytes": float(len(verdict.encode())),
    }


def phase_total(rank: dict[str, Any], kind: str, phase: str) -> int:
    return sum(v for k, v in rank[kind].items() if k.startswith(f"{phase}:"))


def rows(ranks: list[dict[str, Any]], output: str) -> dict[str, float]:
    """The table's items at one world size."""
    zero = next(r for r in ranks if r["rank"] == 0)
    steps, epochs = zero["steps"], zero["epochs"]
    heaviest = max(ranks, key=lambda r: phase_total(r, "sent", "step"))
    lines = output.count("\n")
    return {
        "collectives per step (rank 0)": phase_total(zero, "calls", "step") / steps,
        "bytes sent per step (most of any rank)": phase_total(heaviest, "sent", "step") / steps,
        "collectives per epoch boundary (rank 0)": phase_total(zero, "calls", "epoch") / epochs,
        "bytes rank 0 receives per epoch": (
            phase_total(zero, "received", "epoch") + phase_total(zero, "received", "step")
        )
        / epochs,
        "collectives at set-up (rank 0)": float(phase_total(zero, "calls", "setup")),
        "store keys at the end": float(zero["store_keys"] or 0),
        "console lines per epoch": len(EPOCH_LINE.findall(output)) / epochs,
        "console lines in all": float(lines),
        "file descriptors per worker (most)": float(max(r["fds"] for r in ranks)),
        "threads per worker (most)": float(max(r["threads"] for r in ranks)),
    }


def growth(sizes: list[int], values: list[float]) -> str:
    """The growth whose a + b f(N) fits best; a row that moves by less than a fifth of its
    largest value over the sizes is constant (a thread more at N=64 is not a growth)."""
    if max(values) - min(values) <= 0.2 * max(1.0, abs(max(values))):
        return "constant"
    best, best_error = "constant", math.inf
    for name, f in GROWTHS.items():
        xs = [f(n) for n in sizes]
        error = _residual(xs, values)
        if error < best_error * 0.5:  # a faster growth must fit clearly better
            best, best_error = name, error
    return best


def _residual(xs: list[float], ys: list[float]) -> float:
    """Squared error of the least-squares line y = a + b x (x constant: y = mean)."""
    n, mean_x, mean_y = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = (
        0.0
        if spread == 0
        else sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    )
    return sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in zip(xs, ys, strict=True)) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4,8,16,32,64", help="world sizes, comma-separated")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    table: dict[str, list[float]] = {}
    for size in sizes:
        found = rows(*run(size, args.epochs)) | hang_rows(size)
        for name, value in found.items():
            table.setdefault(name, []).append(value)
        print(f"N={size}: " + ", ".join(f"{k} {v:g}" for k, v in found.items()), flush=True)
    print(f"\n{args.epochs} epochs of 8 steps at each world size; gloo on loopback, 2 cores\n")
    print("| item | " + " | ".join(f"N={n}" for n in sizes) + " | growth |")
    print("|---|" + "---|" * len(sizes) + "---|")
    for name, values in table.items():
        cells = " | ".join(f"{v:,.1f}".rstrip("0").rstrip(".") for v in values)
        print(f"| {name} | {cells} | {growth(sizes, values)} |")


if __name__ == "__main__":
    main()
