"""What one restart costs: a 2-worker job whose rank 1 is killed (SIGKILL) once, restarted by
the launcher (``--max-restarts 1``), against the same launcher's plain launch.

Three launchers, alternating in one run: ``ddpkit run --fresh-workers`` (a fresh ``python``
per worker, as torchrun), ``ddpkit run`` (its default: workers forked from a server that
imported torch once, and a restart forks again from it) and ``torchrun --standalone``. For
each, the median wall time of the job with its restart, of the plain job (`noop_job.py`),
and their difference: the restart's cost. The job does no training (no checkpoint to load,
nothing compiled): what is measured is the launcher's and the interpreters' part. A third
job is a real one's start: ``examples/gpt.py`` (unchanged, run by ``first_step_job.py``),
timed from launch to the end of its first optimizer step on every rank, and to exit
(``DDPKIT_MAX_STEPS=1`` ends it there). A job that fails or hangs (60 s) is counted apart
and said; torchrun's restart of the plain job did both here (its second attempt's gloo
could not connect).

    .venv/bin/python benchmarks/restart_cost.py --repeat 5
    .venv/bin/python benchmarks/restart_cost.py --repeat 5 --jobs gpt
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).parent
FIRST_STEP_JOB = str(HERE / "first_step_job.py")
GPT_TO_EXIT = "gpt: launch to exit"
# job -> (script, environment): DDPKIT_MAX_STEPS=1 ends the GPT example after its first step
JOBS = {
    "plain": (str(HERE / "noop_job.py"), {}),
    "restarted": (str(HERE / "restart_job.py"), {}),
    GPT_TO_EXIT: (FIRST_STEP_JOB, {"DDPKIT_MAX_STEPS": "1"}),
}
TO_FIRST_STEP = "gpt: launch to first step"  # read from the marks the GPT job writes
LAUNCHERS = {
    "ddpkit run --fresh-workers": [
        *(sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "--max-restarts", "1"),
        "--fresh-workers",
    ],
    "ddpkit run (warm workers)": [
        *(sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "--max-restarts", "1"),
    ],
    "torchrun --standalone": [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *("--nproc-per-node", "2", "--max-restarts", "1"),
    ],
}


def time_once(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Seconds from launch to exit, and to the first step's end on every rank where the job
    marks it (else NaN); NaN both for a job that failed or hung (said once, below)."""
    with tempfile.TemporaryDirectory() as scratch:
        marks = Path(scratch) / "first_step"
        start_wall, start = time.time(), time.perf_counter()
        # PET_* would set torch's launcher flags: each launcher runs with its own, listed above
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
        env = {**inherited, **env, "FIRST_STEP_MARK": str(marks)}
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
        except subprocess.TimeoutExpired:
            return math.nan, math.nan
        if done.returncode != 0:
            return math.nan, math.nan
        ended = time.perf_counter() - start
        stepped = [float(m.read_text()) for m in Path(scratch).glob("first_step.*")]
        return ended, (max(stepped) - start_wall) if len(stepped) == 2 else math.nan


def summary(values: list[float]) -> str:
    ok = [v for v in values if not math.isnan(v)]
    failed = len(values) - len(ok)
    median = f"{statistics.median(ok):.2f} s" if ok else "-"
    return median + (f" ({failed} of {len(values)} failed or hung)" if failed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--jobs", default="plain,restarted,gpt", help="of: plain, restarted, gpt")
    args = parser.parse_args()
    asked = args.jobs.split(",")
    jobs = [job for job in JOBS if job in asked or (job == GPT_TO_EXIT and "gpt" in asked)]
    runs = [(la, job) for la in LAUNCHERS for job in jobs]
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    for _ in range(args.repeat):
        for launcher, job in runs:
            script, env = JOBS[job]
            ended, stepped = time_once([*LAUNCHERS[launcher], script], env)
            times[(launcher, job)].append(ended)
            if job == GPT_TO_EXIT:
                times[(launcher, TO_FIRST_STEP)].append(stepped)
    jobs += [TO_FIRST_STEP] if GPT_TO_EXIT in jobs else []
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
