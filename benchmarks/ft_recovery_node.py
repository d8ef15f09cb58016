"""What losing a whole node costs (issue 67), side by side in one run: two network-namespace
hosts (tests/helpers/netns.py) of 2 workers each; once host 0's ranks have made KILL_AT
steps, host 1's launcher and every process under it are killed with -9 (its memory is lost
with them) and a replacement is started on host 1 at once.

- ``files``: ``ddpkit run --nnodes 2 --nproc 2 --max-restarts 2 --no-memory-snapshots``
  (torch's c10d rendezvous on host 0), a checkpoint every SAVE steps: every rank resumes
  from the last checkpoint.
- ``memory``: the same with memory snapshots (the default): host 0's ranks resume from their
  own memory, host 1's from the copies host 0 kept of theirs (in the background, at most one
  in flight: a copy that lags behind costs the steps it lags).
- ``ft``: replica groups (ddpkit.ReplicaGroups), the lighthouse and group 0 on host 0, group
  1 on host 1, 2 processes each; group 0 trains on alone and heals group 1 when it is back.

The job is benchmarks/ft_recovery_job.py (one batch a step, a 0.1 s pause). Measured from host
0's lines, median of --repeat alternating runs: steps lost (done again or dropped), the
stall (the longest gap between two of host 0's steps around the kill), the time from the kill
to host 1 training again, and the job's own time from launch to its first step. Needs root
(network namespaces) and torchft for the ``ft`` side.

    sudo GLOO_SOCKET_IFNAME=lo .venv/bin/python benchmarks/ft_recovery_node.py --repeat 3
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ft_recovery import JOB, KILL_AT, LINE, REPO, SAVE, Process, ddpkit, kill_9

sys.path.insert(0, str(REPO / "tests"))
from helpers.netns import VirtualHost, virtual_hosts
from helpers.replica_groups import start_lighthouse

EPOCHS = 12  # 6 steps an epoch at a world of 4 (96 samples, batches of 4): 72 steps
RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"
_runs = itertools.count()


def host_steps(process: Process) -> list[tuple[int, int, float]]:
    """(step, committed, time) of every step line of any rank on that host, in time order."""
    found = [LINE.search(line) for _, line in list(process.lines)]
    return sorted(((int(m[3]), int(m[4]), float(m[6])) for m in found if m), key=lambda s: s[2])


def newest_step(process: Process) -> int:
    return max((step for step, _, _ in host_steps(process)), default=0)


def around_the_kill(steps: list[tuple[int, int, float]], killed: float) -> tuple[
    tuple[int, int, float], tuple[int, int, float], int
]:  # fmt: skip
    """The last step before the stall and the first after it (the stall: the longest gap
    after the kill; a step in flight may still end just after it), and the newest step
    completed before the stall."""
    done = [s for s in steps if s[2] < killed]
    after = [s for s in steps if s[2] >= killed]
    pairs = list(itertools.pairwise([done[-1], *after]))
    last, first = max(pairs, key=lambda pair: pair[1][2] - pair[0][2])
    newest = max(s[0] for s in steps if s[2] <= last[2])
    return last, first, newest


def launcher(hosts: list[VirtualHost], index: int, folder: Path, memory: bool, run: str
             ) -> Process:  # fmt: skip
    """One host's ``ddpkit run`` of the exact-restart job, 2 of the world's 4 ranks, in the
    rendezvous named ``run``."""
    host = hosts[index]
    files_only = [] if memory else ["--no-memory-snapshots"]
    command = host.command(*ddpkit(
        "run", "--nproc", "2", "--nnodes", "2", "--rdzv-endpoint", f"{hosts[0].address}:29400",
        "--rdzv-id", run, "--max-restarts", "2", "--rdzv-conf", RDZV_CONF, "--local-addr",
        host.address, *files_only, JOB, "restart", str(EPOCHS), str(folder), str(SAVE),
    ))  # fmt: skip
    return Process(command, {**os.environ, "GLOO_SOCKET_IFNAME": host.interface})


def exact_restart(memory: bool) -> dict[str, float]:
    with virtual_hosts(2, prefix="dkfr") as hosts, tempfile.TemporaryDirectory() as folder:
        run = f"node-lost-{os.getpid()}-{next(_runs)}"
        first, second = (launcher(hosts, i, Path(folder), memory, run) for i in (0, 1))
        with stopped_at_the_end(first, second) as parts:
            first.wait_for(lambda: newest_step(first) >= KILL_AT, 180)
            killed = kill_9(second)
            parts.append(launcher(hosts, 1, Path(folder), memory, run))
            first.process.wait(timeout=300)
        steps = host_steps(first)
    last, resumed, newest = around_the_kill(steps, killed)
    return {
        "steps lost": float(newest - (resumed[0] - 1)),
        "stall s": resumed[2] - last[2],
        "kill to training again s": resumed[2] - killed,
        "launch to first step s": steps[0][2] - first.started,
    }


def replica_groups() -> dict[str, float]:
    with virtual_hosts(2, prefix="dkfg") as hosts:
        server, address = start_lighthouse(host=hosts[0])
        env = {**os.environ, "RUST_LOG": "warn", "TORCHFT_LIGHTHOUSE": address}
        env.pop("GLOO_SOCKET_IFNAME", None)  # each group's own store on its host's loopback

        def group(index: int, host: VirtualHost) -> Process:
            command = host.command(*ddpkit("run", "--nproc", "2", JOB, "ft", str(EPOCHS)))
            return Process(command, {**env, "DDPKIT_FT_GROUP": str(index)})

        survivor, doomed = group(0, hosts[0]), group(1, hosts[1])
        with stopped_at_the_end(survivor, doomed) as parts:
            doomed.wait_for(lambda: newest_step(doomed) >= KILL_AT, 180)
            killed = kill_9(doomed)
            back = group(1, hosts[1])
            parts.append(back)
            back.wait_for(lambda: bool(host_steps(back)), 180)
            survivor.process.wait(timeout=300)
        server.terminate()
        server.wait(timeout=30)
    steps = host_steps(survivor)
    last, resumed, _ = around_the_kill(steps, killed)
    before = [s for s in steps if s[2] < killed]
    dropped = (steps[-1][0] - steps[-1][1]) - (before[-1][0] - before[-1][1])
    return {
        "steps lost": float(dropped),
        "stall s": resumed[2] - last[2],
        "kill to training again s": host_steps(back)[0][2] - killed,
        "launch to first step s": steps[0][2] - survivor.started,
    }


@contextlib.contextmanager
def stopped_at_the_end(*started: Process) -> Iterator[list[Process]]:
    """The parts of a run, and any added while it runs, killed if still running at its end."""
    parts = list(started)
    try:
        yield parts
    finally:
        for part in parts:
            if part.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    kill_9(part)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sides", default="ft,files,memory", help="comma-separated")
    args = parser.parse_args()
    sides = args.sides.split(",")
    measure = {"ft": replica_groups, "files": lambda: exact_restart(memory=False),
               "memory": lambda: exact_restart(memory=True)}  # fmt: skip
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for _ in range(args.repeat):
        for side in sides:
            runs[side].append(measure[side]())
        print({side: found[-1] for side, found in runs.items()}, flush=True)
    print(f"\nmedian of {args.repeat} alternating runs; 2 hosts x 2 workers, host 1 killed "
          f"with -9 at step {KILL_AT} and started again at once (restarts: a checkpoint every "
          f"{SAVE} steps)\n")  # fmt: skip
    names = {"ft": "replica groups (torchft)", "files": "exact restart from files",
             "memory": "restart from memory"}  # fmt: skip
    print("| measure | " + " | ".join(names[s] for s in sides) + " |")
    print("|---|" + "---|" * len(sides))
    for name in runs[sides[0]][0]:
        cells = [f"{statistics.median(r[name] for r in runs[side]):.2f}" for side in sides]
        print(f"| {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
