"""Helpers shared by the tests that start real launchers and system tools."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddpkit.checkpoint.savetimes import SAVE_TIMES_FILE

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "scripts"  # small scripts the tests launch


def folder_names(folder: Path) -> list[str]:
    """The names in a checkpoint folder, sorted, less the save times kept there for doctor
    (a temporary file left behind still shows)."""
    return sorted(p.name for p in folder.iterdir() if p.name != SAVE_TIMES_FILE)


def metric_lines(log: str) -> list[str]:
    """Per-epoch and final metric lines of examples/wine.py, without the timings (and
    without the merged console's ``[rank0]``: other launchers print none)."""
    keep = ("epoch ", "test accuracy")
    return [line.split("(")[0].strip() for line in worker_lines(log) if line.startswith(keep)]


def worker_lines(log: str) -> list[str]:
    """The lines as the workers printed them, from ``ddpkit run``'s merged console: a
    ``[ranks 0-1] X`` line is X once per rank, ``[rank1] X`` is X; other lines as they are."""
    lines = []
    for line in log.splitlines():
        found = re.match(r"\[ranks? ?([\d,-]+)\] (.*)", line)
        lines += [found[2]] * _rank_count(found[1]) if found else [line]
    return lines


def _rank_count(ranks: str) -> int:
    spans = [part.split("-") for part in ranks.split(",")]
    return sum(int(span[-1]) - int(span[0]) + 1 for span in spans)


def ddpkit_cli(
    *args: str, timeout: float = 120, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the ``ddpkit`` command from the repository root, as a user would (``input``: what
    its standard input holds; ``env``: variables set on top of this process's)."""
    return subprocess.run(
        [sys.executable, "-m", "ddpkit", *args], env={**os.environ, **(env or {})},
        cwd=REPO, capture_output=True, text=True, timeout=timeout, input=input,
    )  # fmt: skip


def wine_on_one_host(epochs: int) -> str:
    """stdout of `ddpkit run --nproc 2 examples/wine.py`: the reference other launches match."""
    done = ddpkit_cli("run", "--nproc", "2", "examples/wine.py", "--epochs", str(epochs))
    assert done.returncode == 0, done.stderr
    return done.stdout


def processes_running(needle: str) -> list[int]:
    """Pids whose command line mentions ``needle`` (from /proc; Linux)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if needle in cmdline.read_bytes().decode(errors="replace"):
                found.append(int(cmdline.parent.name))
        except OSError:  # the process ended while we looked
            continue
    return found


def ensure_debian_package(binary: str, package: str) -> str:
    """Path of ``binary``; installs Debian's ``package`` with root and apt-get, else skips."""
    ensure_debian_packages({binary: package})
    return shutil.which(binary) or pytest.skip(f"{package} installed no {binary}")


def ensure_debian_packages(needed: dict[str, str]) -> None:
    """Install the Debian packages of the ``{binary: package}`` missing from PATH, or skip."""
    packages = sorted({pkg for binary, pkg in needed.items() if shutil.which(binary) is None})
    if not packages:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"{', '.join(packages)} missing and cannot be installed (needs root, apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", *packages]
    done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:  # a fresh machine may not know the packages yet
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, timeout=600)
        done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        pytest.skip(f"installing {', '.join(packages)} failed: {done.stderr.strip()[-300:]}")


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the hash of its bytes and its modification time."""
    return {
        str(path.relative_to(folder)): f"{hashlib.sha256(path.read_bytes()).hexdigest()} "
        f"{path.stat().st_mtime_ns}"
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }
