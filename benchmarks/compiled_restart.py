"""What a failure costs a compiled model's job: kill -9 of one worker to the first step after
the restart, on "a new node" (the restarted attempt's /tmp is empty, so torch's default
compile cache is gone). Alternating in one run:

- ``ddpkit run --fresh-workers`` and ``ddpkit run`` (warm workers, its default): the Trainer
  with a checkpoint each epoch, ``prepare_model(compile=True)`` (its kernels kept with the run);
- ``ddpkit run --fresh-workers`` with the user's own ``TORCHINDUCTOR_CACHE_DIR`` in each
  node's scratch (empty on the new node): the run's kept kernels seed it;
- ``torchrun --standalone``: the tutorials' hand-written equivalent (DDP, ``torch.compile``,
  rank 0's ``torch.save`` each epoch, resume from the newest file).

The job is ``benchmarks/compiled_restart_job.py``; the median over the runs whose restart
worked, and how many did not (torchrun's second attempt's gloo often fails to connect here),
are printed with each one's ratio to torchrun's.

    GLOO_SOCKET_IFNAME=lo .venv/bin/python benchmarks/compiled_restart.py --repeat 3
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

JOB = str(Path(__file__).with_name("compiled_restart_job.py"))
RUN = [sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "--max-restarts", "1"]
OWN_CACHE = "ddpkit run --fresh-workers (own cache dir)"
VARIANTS = {
    "ddpkit run --fresh-workers": [*RUN, "--fresh-workers", JOB, "ddpkit"],
    OWN_CACHE: [*RUN, "--fresh-workers", JOB, "ddpkit"],
    "ddpkit run (warm workers)": [*RUN, JOB, "ddpkit"],
    "torchrun + hand-written": [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"),
        *("2", "--max-restarts", "1", JOB, "hand"),
    ],
}


def restart_seconds(command: list[str], own_cache: bool = False) -> float:
    """Kill to the first step after the restart; NaN when the job failed or hung."""
    env = {**os.environ, "BENCH_OWN_INDUCTOR_CACHE": "1"} if own_cache else None
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "run"
        try:
            done = subprocess.run(
                [*command, str(folder)], capture_output=True, timeout=240, env=env
            )
        except subprocess.TimeoutExpired:
            return math.nan
        marks = [folder / "killed", folder / "resumed"]
        if done.returncode != 0 or not all(m.exists() for m in marks):
            return math.nan
        return float(marks[1].read_text()) - float(marks[0].read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeat):
        for name, command in VARIANTS.items():
            times[name].append(restart_seconds(command, own_cache=name == OWN_CACHE))
    medians = {}
    for name, values in times.items():
        ok = [v for v in values if not math.isnan(v)]
        medians[name] = statistics.median(ok) if ok else math.nan
        runs = ", ".join("failed" if math.isnan(v) else f"{v:.2f}" for v in values)
        print(f"{name:26s} kill to first step after the restart: median {medians[name]:.2f} s"
              f"  (runs: {runs})")  # fmt: skip
    for name in ("ddpkit run --fresh-workers", OWN_CACHE, "ddpkit run (warm workers)"):
        print(f"ratio {name} / torchrun: {medians[name] / medians['torchrun + hand-written']:.3f}")


if __name__ == "__main__":
    main()
