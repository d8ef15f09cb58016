"""How long a preempted job takes to stop: SIGTERM to `ddpkit run` until it exits with 75.

Runs the wine example on 2 workers with a checkpoint_dir, waits for its first checkpoint and
a moment more, sends SIGTERM to the launcher, and times the exit: the ranks agree on a stop
at their next exchange (about once a second), checkpoint, and leave; torch's agent then
reaps them. Prints each run's time and where it stopped.

    .venv/bin/python benchmarks/stop_latency.py --runs 3
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one_run() -> tuple[int, float, str]:
    """(exit code, seconds from SIGTERM to exit, the launcher's stop line)."""
    folder = Path(tempfile.mkdtemp(prefix="ddpkit-stop-"))
    command = [sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "examples/wine.py",
               "--epochs", "100000", "--checkpoint-dir", str(folder),
               "--save-every-steps", "100"]  # fmt: skip
    job = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        while not any(folder.iterdir()):
            time.sleep(0.01)
        time.sleep(0.5)
        start = time.perf_counter()
        job.send_signal(signal.SIGTERM)
        code = job.wait(timeout=120)
        seconds = time.perf_counter() - start
        stops = [line for line in job.stderr.read().splitlines() if "stopped by" in line]  # type: ignore[union-attr]
        return code, seconds, stops[0] if stops else ""
    finally:
        if job.poll() is None:
            job.kill()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.runs):
        code, seconds, line = one_run()
        where = line.split(" after saving")[0].removeprefix("ddpkit run: workers ")
        print(f"exit {code} {seconds:.2f} s after SIGTERM: {where}")


if __name__ == "__main__":
    main()
