"""What ddpkit adds to a process's imports: `import torch` vs ddpkit's training API.

Each side runs in a fresh interpreter with ``-X importtime``, alternating so machine noise
hits both alike; the medians of the cumulative import times and their difference are
printed. Target: ddpkit's training API (init, prepare_model, prepare_loader, Trainer) costs
under 0.2 s more than torch; ``import ddpkit`` alone imports no torch at all.

    .venv/bin/python benchmarks/import_cost.py --repeat 7
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

SIDES = {
    "import torch": "import torch",
    "import ddpkit": "import ddpkit",
    "ddpkit training API": (
        "import ddpkit; ddpkit.init; ddpkit.prepare_model; ddpkit.prepare_loader; ddpkit.Trainer"
    ),
}


def import_seconds(code: str) -> float:
    """Sum of the top-level imports' cumulative times that ``-X importtime`` reports."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    total = 0
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if name.startswith(" ") and not name.startswith("  ") and cumulative.strip().isdigit():
            total += int(cumulative)  # a top-level import: its children are inside it
    return total / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in SIDES}
    for _ in range(args.repeat):
        for name, code in SIDES.items():
            times[name].append(import_seconds(code))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        runs = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:22s} median {medians[name]:.3f} s  (runs: {runs})")
    extra = medians["ddpkit training API"] - medians["import torch"]
    print(f"ddpkit's training API over torch: {extra:+.3f} s  (target < 0.2 s)")


if __name__ == "__main__":
    main()
