"""N ranks of a tiny Trainer job launched, trained and ended: ``ddpkit run`` against
``torchrun --standalone`` running the hand-written twin (benchmarks/scale_plain_job.py), side
by side, alternating, in one run; the medians and their ratio. Target: ratio <= 1.0.

    .venv/bin/python benchmarks/scale_launch.py --nproc 32 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent


def commands(nproc: int, out: str) -> dict[str, list[str]]:
    return {
        "ddpkit run": [sys.executable, "-m", "ddpkit", "run", "--nproc", str(nproc),
                       str(HERE / "scale_cost_job.py"), out, "3"],
        "torchrun --standalone": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  "--nproc-per-node", str(nproc),
                                  str(HERE / "scale_plain_job.py"), "3"],
    }  # fmt: skip


def time_once(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    env = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **env})  # fmt: skip
    elapsed = time.perf_counter() - start
    output = done.stdout + done.stderr
    twin = "torch.distributed.run" in command
    if done.returncode != 0 and twin and "epoch 3/3" in output and "SIGABRT" in output:
        # The hand-written twin trained to its end and a worker aborted at exit: torch's gloo
        # thread freeing the last all-reduce's tensor while the interpreter shuts down (the
        # default group outlives destroy_process_group once DDP imported
        # torch.distributed.nn); ddpkit's shutdown avoids it. Timed as it ran, and said.
        print("note: torchrun's job trained to its end, then a worker aborted at exit "
              "(torch's gloo teardown race)", flush=True)  # fmt: skip
    elif done.returncode != 0:
        raise SystemExit(f"{command} failed:\n{done.stderr[-3000:]}")
    return elapsed, output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {}
    stragglers = 0
    with tempfile.TemporaryDirectory() as out:
        for _ in range(args.repeat):
            for name, command in commands(args.nproc, out).items():
                seconds, output = time_once(command)
                times.setdefault(name, []).append(seconds)
                stragglers += sum("straggler:" in line and "CPU ranks on" not in line
                                  for line in output.splitlines())  # fmt: skip
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        runs = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name:22s} median {medians[name]:.1f} s  (runs: {runs})")
    ratio = medians["ddpkit run"] / medians["torchrun --standalone"]
    print(f"ratio ddpkit run / torchrun at {args.nproc} ranks: {ratio:.3f}  (target <= 1.0)")
    print(f"straggler lines without the oversubscription note: {stragglers}")


if __name__ == "__main__":
    main()
