"""CPU seconds of a test folder's multi-process tests, warm workers (``ddpkit run``'s default)
against fresh ones (``PET_START_METHOD=spawn``: a ``python`` a worker), each run in a cgroup
of its own so that every descendant counts. ``/usr/bin/time`` and ``getrusage`` cannot: warm
workers are children of Python's forkserver, which nothing waits for.

Needs root and a cgroup v1 ``cpuacct`` hierarchy or cgroup v2 (``cpu.stat``).

    sudo .venv/bin/python benchmarks/tests_cpu_seconds.py tests/multiproc/train
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")


def cgroup(name: str) -> Path:
    """A fresh cgroup that counts CPU time."""
    root = V1 if V1.is_dir() else V2
    folder = root / f"ddpkit-bench-{name}-{os.getpid()}"
    folder.mkdir()
    return folder


def cpu_seconds(folder: Path) -> float:
    if (folder / "cpuacct.usage").exists():
        return int((folder / "cpuacct.usage").read_text()) / 1e9
    stat = dict(line.split() for line in (folder / "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"]) / 1e6


def run(folder: str, fresh: bool) -> tuple[float, str]:
    group = cgroup("fresh" if fresh else "warm")
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    if fresh:
        env["PET_START_METHOD"] = "spawn"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
               "--dist", "loadfile", folder]  # fmt: skip
    enter = f"echo $$ > {group}/cgroup.procs && exec " + " ".join(command)
    done = subprocess.run(["sh", "-c", enter], env=env, capture_output=True, text=True)
    seconds = cpu_seconds(group)
    group.rmdir()
    return seconds, (done.stdout.strip().splitlines() or [""])[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="tests/multiproc/train")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: it makes a cgroup for each run")
    warm, warm_said = run(args.folder, fresh=False)
    fresh, fresh_said = run(args.folder, fresh=True)
    print(f"warm workers  {warm:8.0f} CPU-s  ({warm_said})")
    print(f"fresh workers {fresh:8.0f} CPU-s  ({fresh_said})")
    print(f"warm / fresh: {warm / fresh:.3f}")


if __name__ == "__main__":
    main()
