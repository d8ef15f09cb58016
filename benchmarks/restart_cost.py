"""What one restart costs: a 2-worker job whose rank 1 is killed (SIGKILL) once, restarted by
the launcher (``--max-restarts 1``), against the same launcher's plain launch.

Three launchers, alternating in one run: ``ddpkit run`` (a fresh ``python`` per worker, as
torchrun), ``ddpkit run --run-path --start-method forkserver`` (workers forked from a server
that imported torch once: a restart forks again from it) and ``torchrun --standalone``. For
each, the median wall time of the job with its restart, of the plain job (`noop_job.py`),
and their difference: the restart's cost. The job does no training (no checkpoint to load,
nothing compiled): what is measured is the launcher's and the interpreters' part. A third
job is a real one's start: ``examples/gpt.py`` to the end of its first optimizer step
(``DDPKIT_MAX_STEPS=1``), launch to exit. A job
that fails or hangs (60 s) is counted apart and said; torchrun's restart of this plain
job did both here (its second attempt's gloo could not connect).

    .venv/bin/python benchmarks/restart_cost.py --repeat 5
    .venv/bin/python benchmarks/restart_cost.py --repeat 5 --jobs "gpt first step"
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
GPT = str(HERE.parent / "examples" / "gpt.py")
# job -> (script, environment): DDPKIT_MAX_STEPS=1 ends the GPT example after its first step
JOBS = {
    "plain": (str(HERE / "noop_job.py"), {}),
    "restarted": (str(HERE / "restart_job.py"), {}),
    "gpt first step": (GPT, {"DDPKIT_MAX_STEPS": "1"}),
}
LAUNCHERS = {
    "ddpkit run": [sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "--max-restarts", "1"],
    "ddpkit run (forkserver)": [
        *(sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "--max-restarts", "1"),
        *("--run-path", "--start-method", "forkserver"),
    ],
    "torchrun --standalone": [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *("--nproc-per-node", "2", "--max-restarts", "1"),
    ],
}


def time_once(command: list[str], env: dict[str, str]) -> float:
    """Seconds from launch to exit; NaN for a job that failed or hung (said once, below)."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60,
                              env={**os.environ, **env})  # fmt: skip
    except subprocess.TimeoutExpired:
        return math.nan
    return time.perf_counter() - start if done.returncode == 0 else math.nan


def summary(values: list[float]) -> str:
    ok = [v for v in values if not math.isnan(v)]
    failed = len(values) - len(ok)
    median = f"{statistics.median(ok):.2f} s" if ok else "-"
    return median + (f" ({failed} of {len(values)} failed or hung)" if failed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--jobs", default=",".join(JOBS), help="of: " + ", ".join(JOBS))
    args = parser.parse_args()
    jobs = [job for job in JOBS if job in args.jobs.split(",")]
    times: dict[tuple[str, str], list[float]] = {(la, job): [] for la in LAUNCHERS for job in jobs}
    for _ in range(args.repeat):
        for (launcher, job), values in times.items():
            script, env = JOBS[job]
            values.append(time_once([*LAUNCHERS[launcher], script], env))
    for launcher in LAUNCHERS:
        print(f"{launcher:24s} " + "; ".join(
            f"{job} {summary(times[(launcher, job)])}" for job in jobs))  # fmt: skip
    for job in jobs:
        print(_ratios(times, job))
    if {"plain", "restarted"} <= set(jobs):
        for launcher in LAUNCHERS:
            cost = _median(times[(launcher, "restarted")]) - _median(times[(launcher, "plain")])
            print(f"{launcher:24s} one restart costs {cost:.2f} s")


def _ratios(times: dict[tuple[str, str], list[float]], job: str) -> str:
    """The job's median time under each launcher as a ratio to torchrun's, from this run."""
    base = _median(times[("torchrun --standalone", job)])
    if math.isnan(base):
        return f"{job}, ratio to torchrun: none (every torchrun run failed or hung)"
    shares = (f"{la} {_median(times[(la, job)]) / base:.3f}" for la in LAUNCHERS)
    return f"{job}, ratio to torchrun: " + ", ".join(shares)


def _median(values: list[float]) -> float:
    ok = [v for v in values if not math.isnan(v)]
    return statistics.median(ok) if ok else math.nan


if __name__ == "__main__":
    main()
