"""What one failure costs (issues 54 and 67): replica groups that train on
(ddpkit.ReplicaGroups, experimental), ddpkit's exact restart from files and its restart from
memory, side by side in one run.

- ``ft``: ``ddpkit lighthouse`` (heartbeat 1 s) and 2 replica groups of 1 process each;
  group 1 is killed with -9 once it has made KILL_AT steps, and started again at once.
- ``files``: ``ddpkit run --nproc 2 --max-restarts 1 --no-memory-snapshots``, a checkpoint
  every SAVE steps; rank 1 is killed with -9 at step KILL_AT; torch's agent restarts both
  ranks, which resume from the last checkpoint.
- ``memory``: the same with memory snapshots (the default with restarts): the restarted
  ranks resume from the newest step every rank holds in ``/dev/shm``.

All train the same small model one batch a step with a 0.1 s pause (benchmarks/
ft_recovery_job.py). Printed per side, median of --repeat alternating runs: steps lost (work
done again or dropped), the stall (the longest gap between two steps around the kill), the
steps the job made while the killed part was away, the time from the kill to the killed part
training again, and (to set it against) the job's own time from launch to its first step.

    GLOO_SOCKET_IFNAME=lo .venv/bin/python benchmarks/ft_recovery.py --repeat 3
    GLOO_SOCKET_IFNAME=lo .venv/bin/python benchmarks/ft_recovery.py --steady --repeat 5

``--steady``: no failure, what a step costs with replica groups against the same job as
one ``ddpkit run --nproc 2``, as a ratio (median of --repeat alternating runs).

``--efficiency``: failures at a steady rate, as torchft's blog measures them: over a window
of WINDOW seconds, no failure, one every 20 s and one every 5 s (a real job's every 60 s and
every 15 s, scaled by 1/3: the window is 60 s, not hours), for replica groups (group 1
killed with -9 and started again at once) and for the exact restart (rank 1 killed, torch's
agent restarts both, each resumes from the last checkpoint, saved every SAVE_EVERY steps in
the background). Training efficiency: the batches committed steps trained in the window,
against the plain job's with no failure; step efficiency: those batches against the
batches computed (the rest was dropped or done again).

    GLOO_SOCKET_IFNAME=lo .venv/bin/python benchmarks/ft_recovery.py --efficiency
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers.jobs import children, rank_of

REPO = Path(__file__).resolve().parent.parent
JOB = str(REPO / "benchmarks" / "ft_recovery_job.py")
KILL_AT, SAVE, EPOCHS = 30, 20, 6  # 24 batches an epoch
# "[rank0] ..." or, the same line from several ranks merged, "[ranks 0-1] ..."
LINE = re.compile(
    r"\[ranks? ?(\d)(?:-(\d))?\] step (\d+) committed (\d+) batches (\d+) at ([\d.]+)"
)


class Process:
    """A command in its own session, its lines collected with the time they came."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self.started = time.time()
        self.process = subprocess.Popen(command, cwd=REPO, env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        start_new_session=True)  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((time.time(), line))

    def steps(self, rank: int = 0) -> list[tuple[int, int, float]]:
        found = [LINE.search(line) for _, line in list(self.lines)]
        return [(int(m[3]), int(m[4]), float(m[6])) for m in found
                if m and int(m[1]) <= rank <= int(m[2] or m[1])]  # fmt: skip

    def batches(self, until: float) -> tuple[int, int]:
        """Up to the moment ``until``: the batches committed steps trained (the latest
        count), and the batches computed (a line a batch of rank 0's)."""
        found = [m for m in (LINE.search(line) for _, line in list(self.lines)) if m]
        before = [m for m in found if float(m[6]) <= until and int(m[1]) == 0]
        return (int(before[-1][5]) if before else 0), len(before)

    def wait_for(self, condition, timeout: float = 120) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise SystemExit("".join(line for _, line in self.lines[-40:]))
            time.sleep(0.01)


def ddpkit(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddpkit", *args]


def kill_9(process: Process, rank_pid: int | None = None) -> float:
    """SIGKILL to the worker (or the whole group) and its launcher; the moment of the kill."""
    moment = time.time()
    if rank_pid is not None:
        os.kill(rank_pid, signal.SIGKILL)
        return moment
    workers = _descendants(process.process.pid)
    os.killpg(process.process.pid, signal.SIGKILL)
    for pid in workers:  # in sessions of their own (torch's launcher)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return moment


def _descendants(pid: int) -> list[int]:
    found, parents = [], [pid]
    while parents:
        below = children(parents.pop())  # the tests' helper: /proc, Linux
        found += below
        parents += below
    return found


def fault_tolerant() -> dict[str, float]:
    env = {**os.environ, "RUST_LOG": "warn", "OMP_NUM_THREADS": "1"}  # as each plain rank's
    lighthouse = Process(
        ddpkit("lighthouse", "--bind", "127.0.0.1:0", "--heartbeat-timeout", "1"), env
    )
    lighthouse.wait_for(lambda: any("TORCHFT_LIGHTHOUSE=" in line for _, line in lighthouse.lines))
    said = next(line for _, line in lighthouse.lines if "TORCHFT_LIGHTHOUSE=" in line)
    env["TORCHFT_LIGHTHOUSE"] = re.search(r"TORCHFT_LIGHTHOUSE=(\S+);", said)[1]  # type: ignore[index]
    group = [ddpkit("run", "--nproc", "1", JOB, "ft", str(EPOCHS))]
    survivor = Process(group[0], {**env, "DDPKIT_FT_GROUP": "0"})
    survivor.wait_for(lambda: bool(survivor.steps()))
    doomed = Process(group[0], {**env, "DDPKIT_FT_GROUP": "1"})
    doomed.wait_for(lambda: len(doomed.steps()) >= KILL_AT)
    killed = kill_9(doomed)
    back = Process(group[0], {**env, "DDPKIT_FT_GROUP": "1"})
    back.wait_for(lambda: bool(back.steps()))
    survivor.process.wait(timeout=300)
    back.process.wait(timeout=120)
    lighthouse.process.terminate()
    lighthouse.process.wait(timeout=30)
    steps = survivor.steps()
    before = [s for s in steps if s[2] < killed]
    after = [s for s in steps if s[2] >= killed]
    healed_at = back.steps()[0][2]
    alone = [s for s in after if s[2] < healed_at]
    together = [s for s in before if s[2] > before[-1][2] - 3]
    dropped = (after[-1][0] - after[-1][1]) - (before[-1][0] - before[-1][1])
    return {
        "steps lost": float(dropped),
        "stall s": max(b[2] - a[2] for a, b in zip([before[-1], *after], after, strict=False)),
        "steps while away": float(len(alone)),
        "steps/s while away": _rate(alone),
        "steps/s together": _rate(together),
        "kill to training again s": healed_at - killed,
        "launch to first step s": steps[0][2] - survivor.started,
    }


def steady(folder: Path) -> tuple[float, float]:
    """No failure: steps/s of 2 replica groups (1 process each) and of the same job as one
    ``ddpkit run --nproc 2``, one after the other; each process 1 thread, as each of the
    plain run's is (two groups each started alone would each take every core)."""
    env = {**os.environ, "RUST_LOG": "warn", "OMP_NUM_THREADS": "1"}
    lighthouse = Process(ddpkit("lighthouse", "--bind", "127.0.0.1:0", "--min-groups", "2"), env)
    lighthouse.wait_for(lambda: any("TORCHFT_LIGHTHOUSE=" in line for _, line in lighthouse.lines))
    said = next(line for _, line in lighthouse.lines if "TORCHFT_LIGHTHOUSE=" in line)
    env["TORCHFT_LIGHTHOUSE"] = re.search(r"TORCHFT_LIGHTHOUSE=(\S+);", said)[1]  # type: ignore[index]
    groups = [Process(ddpkit("run", "--nproc", "1", JOB, "ft", str(EPOCHS)),
                      {**env, "DDPKIT_FT_GROUP": str(g)}) for g in (0, 1)]  # fmt: skip
    for group in groups:
        group.process.wait(timeout=300)
    lighthouse.process.terminate()
    lighthouse.process.wait(timeout=30)
    plain = Process(ddpkit("run", "--nproc", "2", JOB, "restart", str(EPOCHS), str(folder),
                           "1000000"), env)  # fmt: skip
    plain.process.wait(timeout=300)
    return _rate(groups[0].steps()[10:]), _rate(plain.steps()[10:])


def exact_restart(folder: Path, memory: bool) -> dict[str, float]:
    """Rank 1 killed at step KILL_AT; resumed from the checkpoint files or from memory."""
    # ddpkit run gives each of its 2 workers 1 thread of the 2 cores; 2 replica groups each
    # started alone would each take both (4 threads on 2 cores): they are given 1 too.
    files_only = [] if memory else ["--no-memory-snapshots"]
    command = ddpkit("run", "--nproc", "2", "--max-restarts", "1", *files_only, JOB, "restart",
                     str(EPOCHS), str(folder), str(SAVE))  # fmt: skip
    job = Process(command, dict(os.environ))
    job.wait_for(lambda: len(job.steps(1)) >= KILL_AT)
    killed = kill_9(job, _rank_pid(job, 1))
    job.process.wait(timeout=300)
    # by the workers' clocks: the merged console shows a line up to half a second late
    last = max(s[0] for s in job.steps() if s[2] < killed)
    after = [s for s in job.steps() if s[2] >= killed]
    resumed = after[0][0] - 1
    return {
        "steps lost": float(last - resumed),
        "stall s": after[0][2] - max(s[2] for s in job.steps() if s[2] < killed),
        "steps while away": 0.0,
        "steps/s while away": 0.0,
        "steps/s together": _rate(job.steps()[-10:]),
        "kill to training again s": after[0][2] - killed,
        "launch to first step s": job.steps()[0][2] - job.started,
    }


WINDOW, SAVE_EVERY = 60.0, 10
RATES = {"no failure": 0.0, "one every 20 s": 20.0, "one every 5 s": 5.0}


def efficiency_of_groups(every: float) -> tuple[int, int]:
    """Replica groups over the window, group 1 killed every ``every`` seconds (0: never)
    and started again at once: (batches committed, batches computed)."""
    env = {**os.environ, "RUST_LOG": "warn", "OMP_NUM_THREADS": "1"}
    lighthouse = Process(
        ddpkit("lighthouse", "--bind", "127.0.0.1:0", "--heartbeat-timeout", "1"), env
    )
    lighthouse.wait_for(lambda: any("TORCHFT_LIGHTHOUSE=" in line for _, line in lighthouse.lines))
    said = next(line for _, line in lighthouse.lines if "TORCHFT_LIGHTHOUSE=" in line)
    env["TORCHFT_LIGHTHOUSE"] = re.search(r"TORCHFT_LIGHTHOUSE=(\S+);", said)[1]  # type: ignore[index]
    command = ddpkit("run", "--nproc", "1", JOB, "ft", "100000")
    survivor = Process(command, {**env, "DDPKIT_FT_GROUP": "0"})
    group1 = [Process(command, {**env, "DDPKIT_FT_GROUP": "1"})]
    for part in (survivor, group1[0]):
        part.wait_for(lambda part=part: bool(part.steps()))
    start = time.time()
    while time.time() < start + WINDOW:
        if every and time.time() >= start + every * len(group1):
            kill_9(group1[-1])
            group1.append(Process(command, {**env, "DDPKIT_FT_GROUP": "1"}))
        time.sleep(0.02)
    end = start + WINDOW
    committed = survivor.batches(end)[0] - survivor.batches(start)[0]
    computed = sum(p.batches(end)[1] - p.batches(start)[1] for p in (survivor, *group1))
    for part in (survivor, *group1):
        kill_9(part)
    lighthouse.process.terminate()
    lighthouse.process.wait(timeout=30)
    return committed, computed


def efficiency_of_restarts(every: float, folder: Path, save: bool = True) -> tuple[int, int]:
    """The exact restart over the window, rank 1 killed every ``every`` seconds (0: never);
    ``save=False``: the plain job, no checkpoint. (batches committed, batches computed)."""
    args = [str(folder), str(SAVE_EVERY), "async"] if save else [str(folder), "1000000"]
    # from files, as this table was first measured (before memory snapshots were the default)
    job = Process(ddpkit("run", "--nproc", "2", "--max-restarts", "100", "--no-memory-snapshots",
                         JOB, "restart", "100000", *args), dict(os.environ))  # fmt: skip
    job.wait_for(lambda: bool(job.steps()))
    start, kills = time.time(), 0
    while time.time() < start + WINDOW:
        if every and time.time() >= start + every * (kills + 1):
            with contextlib.suppress(SystemExit, ProcessLookupError):  # mid-restart: next
                kill_9(job, _rank_pid(job, 1))
                kills += 1
        time.sleep(0.02)
    end = start + WINDOW
    committed = job.batches(end)[0] - job.batches(start)[0]
    computed = 2 * (job.batches(end)[1] - job.batches(start)[1])  # both ranks compute
    kill_9(job)
    return committed, computed


def print_efficiency() -> None:
    with tempfile.TemporaryDirectory() as folder:
        plain, _ = efficiency_of_restarts(0.0, Path(folder), save=False)
    print(f"plain DDP, no failure, no checkpoint: {plain} batches in {WINDOW:g} s", flush=True)
    rows = []
    for name, every in RATES.items():
        groups = efficiency_of_groups(every)
        with tempfile.TemporaryDirectory() as folder:
            restart = efficiency_of_restarts(every, Path(folder))
        rows.append((name, groups, restart))
        print(name, {"replica groups": groups, "exact restart": restart}, flush=True)
    print(f"\na window of {WINDOW:g} s on 2 CPU cores; batches of 4 samples committed "
          f"(plain DDP with no failure: {plain}); exact restart: async checkpoints every "
          f"{SAVE_EVERY} steps\n")  # fmt: skip
    print("| failures | replica groups: training / step efficiency | exact restart: training "
          "/ step efficiency |\n|---|---|---|")  # fmt: skip
    for name, (g_done, g_work), (r_done, r_work) in rows:
        print(f"| {name} | {g_done / plain:.1%} / {g_done / max(g_work, 1):.1%} | "
              f"{r_done / plain:.1%} / {r_done / max(r_work, 1):.1%} |")  # fmt: skip


def _rank_pid(job: Process, rank: int) -> int:
    for pid in _descendants(job.process.pid):
        if rank_of(pid) == rank:  # the tests' helper: a fresh worker's RANK, a warm one's title
            return pid
    raise SystemExit(f"no worker of rank {rank}")


def _rate(steps: list[tuple[int, int, float]]) -> float:
    if len(steps) < 2:
        return 0.0
    return (len(steps) - 1) / (steps[-1][2] - steps[0][2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steady", action="store_true",
                        help="no failure: a step's cost with replica groups, a ratio")  # fmt: skip
    parser.add_argument("--efficiency", action="store_true",
                        help="failures at a steady rate: training and step efficiency")  # fmt: skip
    args = parser.parse_args()
    if args.steady:
        return print_steady(args.repeat)
    if args.efficiency:
        return print_efficiency()
    runs: dict[str, list[dict[str, float]]] = {"ft": [], "files": [], "memory": []}
    for _ in range(args.repeat):
        runs["ft"].append(fault_tolerant())
        for side in ("files", "memory"):
            with tempfile.TemporaryDirectory() as folder:
                runs[side].append(exact_restart(Path(folder), memory=side == "memory"))
        print({side: found[-1] for side, found in runs.items()}, flush=True)
    print(f"\nmedian of {args.repeat} alternating runs, a kill -9 at step {KILL_AT} "
          f"(restarts: a checkpoint every {SAVE} steps)\n")  # fmt: skip
    print("| measure | replica groups (torchft) | exact restart from files | restart from "
          "memory |\n|---|---|---|---|")  # fmt: skip
    for name in runs["ft"][0]:
        cells = [f"{statistics.median(r[name] for r in runs[side]):.2f}" for side in runs]
        print(f"| {name} | {' | '.join(cells)} |")


def print_steady(repeat: int) -> None:
    rates = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as folder:
            rates.append(steady(Path(folder)))
        print(f"replica groups {rates[-1][0]:.2f} steps/s, plain {rates[-1][1]:.2f} steps/s",
              flush=True)  # fmt: skip
    ratios = [plain / ft for ft, plain in rates]
    print(
        f"\nmedian of {repeat} alternating runs, no failure: replica groups "
        f"{statistics.median(r[0] for r in rates):.2f} steps/s, plain DDP "
        f"{statistics.median(r[1] for r in rates):.2f} steps/s; a step costs "
        f"{statistics.median(ratios):.3f}x (runs: {', '.join(f'{r:.3f}' for r in ratios)})"
    )


if __name__ == "__main__":
    main()
