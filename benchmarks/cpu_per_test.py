"""A pytest plugin: each test's CPU seconds, its launched processes' included, one JSON line
a test in the file named by ``CPU_PER_TEST_OUT``.

Each pytest-xdist worker moves itself into a cgroup of its own (cgroup v1 ``cpuacct`` or v2),
so every process a test starts (launchers, Python's forkserver and the workers it forks,
which nothing waits for) counts to that worker; a test's CPU is the cgroup's usage across it.
Loaded by ``benchmarks/tests_cpu_seconds.py --per-test``; needs root.

    CPU_PER_TEST_OUT=/tmp/cpu.jsonl PYTHONPATH=benchmarks python -m pytest -p cpu_per_test -n 2 ...
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests_cpu_seconds import cgroup, cpu_seconds

_group: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    """In a pytest-xdist worker (or a run without workers): into a cgroup of its own."""
    global _group
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    controller = worker is None and config.getoption("numprocesses", None)
    if os.environ.get("CPU_PER_TEST_OUT") and not controller:
        _group = cgroup(worker or "main")
        (_group / "cgroup.procs").write_text(str(os.getpid()))


def pytest_unconfigure(config: pytest.Config) -> None:
    """Back into the parent cgroup, and the worker's own removed (once its tests' processes
    are gone: a straggler keeps it, harmlessly)."""
    if _group is not None:
        (_group.parent / "cgroup.procs").write_text(str(os.getpid()))
        with contextlib.suppress(OSError):
            _group.rmdir()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    if _group is None:
        yield
        return
    cpu, wall = cpu_seconds(_group), time.monotonic()
    yield
    row = {"test": item.nodeid, "cpu": cpu_seconds(_group) - cpu,
           "wall": time.monotonic() - wall}  # fmt: skip
    with open(os.environ["CPU_PER_TEST_OUT"], "a") as out:
        out.write(json.dumps(row) + "\n")
