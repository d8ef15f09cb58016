"""CPU seconds of a test folder's multi-process tests, warm workers (``ddpkit run``'s default)
against fresh ones (``PET_START_METHOD=spawn``: a ``python`` a worker), each run in a cgroup
of its own so that every descendant counts. ``/usr/bin/time`` and ``getrusage`` cannot: warm
workers are children of Python's forkserver, which nothing waits for.

Needs root and a cgroup v1 ``cpuacct`` hierarchy or cgroup v2 (``cpu.stat``).

    sudo .venv/bin/python benchmarks/tests_cpu_seconds.py tests/multiproc/train

``--per-test`` instead runs the folder once (warm workers, 2 pytest workers, as ``make
test``'s first pass) and lists its tests by CPU seconds, each with its wall time and their
ratio (well under 1: a test that mostly waits), and the folders' totals: where ``make
test``'s CPU goes (:mod:`cpu_per_test`, a pytest plugin, counts each test).

    sudo .venv/bin/python benchmarks/tests_cpu_seconds.py --per-test tests -m "not serial"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
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


def per_test(folder: str, pytest_args: list[str], top: int) -> None:
    """Run ``folder`` once with :mod:`cpu_per_test` and print where its CPU went."""
    with tempfile.TemporaryDirectory() as private:  # its own folder: no name others can plant
        out = Path(private) / "cpu.jsonl"
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "CPU_PER_TEST_OUT": str(out),
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                              os.environ.get("PYTHONPATH", "")])}  # fmt: skip
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                   "cpu_per_test", "-rfE", "-n", "2", "--dist", "loadfile", *pytest_args,
                   folder]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    said = done.stdout.strip().splitlines() or ["(no pytest summary)"]
    print(said[-1])
    for line in said:  # a failed test named, with pytest's one-line reason (-rfE)
        if line.startswith(("FAILED ", "ERROR ")):
            print(f"  {line}")
    cpu, wall = sum(r["cpu"] for r in rows), sum(r["wall"] for r in rows)
    ratio = cpu / max(wall, 1e-9)
    print(f"{len(rows)} tests: {cpu:.0f} CPU-s in {wall:.0f} s of tests (ratio {ratio:.2f})")
    folders: dict[str, list[float]] = {}
    for row in rows:
        total = folders.setdefault(row["test"].split("::")[0].rsplit("/", 1)[0], [0.0, 0.0])
        total[0], total[1] = total[0] + row["cpu"], total[1] + row["wall"]
    print("\n  CPU-s   wall-s  folder")
    for name, (c, w) in sorted(folders.items(), key=lambda kv: -kv[1][0]):
        print(f"{c:7.0f} {w:8.0f}  {name}")
    files: dict[str, list[float]] = {}  # a file's tests often share a job (module fixtures)
    for row in rows:
        total = files.setdefault(row["test"].split("::")[0], [0.0, 0.0, 0])
        total[0], total[1], total[2] = total[0] + row["cpu"], total[1] + row["wall"], total[2] + 1
    print(f"\n  CPU-s   wall-s  tests  the {top} files that take the most CPU")
    for name, (c, w, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{c:7.0f} {w:8.0f} {n:6.0f}  {name}")
    print(f"\n  CPU-s   wall-s  ratio  the {top} tests that take the most CPU")
    for row in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        ratio = row["cpu"] / max(row["wall"], 1e-9)
        print(f"{row['cpu']:7.1f} {row['wall']:8.1f} {ratio:6.2f}  {row['test']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="tests/multiproc/train")
    parser.add_argument("--per-test", action="store_true",
                        help="one run, its tests listed by CPU seconds (after it: pytest's "
                        "own arguments, e.g. -m 'not serial')")  # fmt: skip
    parser.add_argument("--top", type=int, default=40, help="with --per-test: tests listed")
    args, pytest_args = parser.parse_known_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: it makes a cgroup for each run")
    if args.per_test:
        per_test(args.folder, pytest_args, args.top)
        return
    warm, warm_said = run(args.folder, fresh=False)
    fresh, fresh_said = run(args.folder, fresh=True)
    print(f"warm workers  {warm:8.0f} CPU-s  ({warm_said})")
    print(f"fresh workers {fresh:8.0f} CPU-s  ({fresh_said})")
    print(f"warm / fresh: {warm / fresh:.3f}")


if __name__ == "__main__":
    main()
