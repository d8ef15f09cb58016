"""A compiled model's kernels are kept with the run's checkpoints: a resume in a fresh process
reuses them instead of compiling again, and a machine whose fingerprint differs (another
CPU instruction set) compiles anew rather than load kernels built for another machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers.launch_helpers import REPO, SCRIPTS

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(240)]


def train(folder: Path, epochs: int, *cpu: str, scratch: bool = False) -> dict[str, Any]:
    """One process, as on a new node: its own empty /tmp, where torch's default cache is
    (``scratch``: the user's own TORCHINDUCTOR_CACHE_DIR there instead, empty too)."""
    node = folder.parent / f"node-{epochs}"
    node.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    if scratch:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(node / "scratch")
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "compiled_resume.py"), str(folder), str(epochs), *cpu],
        cwd=REPO, capture_output=True, text=True, timeout=200, env={**env, "TMPDIR": str(node)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("cache "))
    said = [x for x in done.stdout.splitlines() if "compiling included" in x]
    return {**json.loads(line.removeprefix("cache ")), "said": said}


def test_a_resume_reuses_the_kernels_wherever_torchs_cache_is_and_another_machine_compiles_anew(
    tmp_path: Path,
) -> None:
    """One run, four nodes (each a fresh process with its own empty /tmp): it compiles in the
    user's own TORCHINDUCTOR_CACHE_DIR (a node-local scratch, as clusters set) and keeps its
    kernels all the same; a resume on a node with torch's default folder loads them; a resume
    on a node whose scratch is empty has it seeded and compiles nothing; a machine of another
    instruction set compiles anew. (One test: every node but the first is a resume of the
    same run, so each compile is paid once.)"""
    tmp_path = tmp_path / "run"
    first = train(tmp_path, 1, scratch=True)
    assert first["miss"] > 0 and first["hit"] == 0, first  # a new run compiles
    assert list((tmp_path.parent / "node-1" / "scratch").iterdir())  # torch used theirs
    caches = list((tmp_path / "compile-cache").iterdir())
    assert len(caches) == 1 and (caches[0] / "fingerprint.json").exists()
    assert [p for p in caches[0].rglob("*") if p.is_file() and p.parent != caches[0]], "none kept"
    assert first["said"] == [f"ddpkit: first step {first['said'][0].split()[3]} s, compiling "
                             f"included: 0 graph(s) from the compile cache, {first['miss']} "
                             "compiled"], first  # fmt: skip
    # inductor's real precompiled header (no stand-in): built on the first node, kept with
    # the run, and taken from there by the resume on a node whose own header folder is empty
    kept = sorted(p.name for p in (caches[0] / "precompiled_headers").iterdir())
    assert any(name.endswith(".gch") for name in kept), kept
    resumed = train(tmp_path, 2)  # a fresh process, as a restart or another node
    assert resumed["hit"] > 0 and resumed["miss"] == 0, resumed
    nodes_own = tmp_path.parent / "node-2" / "torchinductor_root" / "precompiled_headers"
    assert not list(nodes_own.glob("*.gch")), list(nodes_own.iterdir())  # not built again
    assert f"{resumed['hit']} graph(s) from the compile cache, 0 compiled" in resumed["said"][0]
    seeded = train(tmp_path, 3, scratch=True)  # the user's scratch on a new node: empty
    assert seeded["hit"] > 0 and seeded["miss"] == 0, seeded
    assert "was seeded with" in seeded["said"][0] and "node-3/scratch" in seeded["said"][0]
    elsewhere = train(tmp_path, 4, "ANOTHER_ISA")
    assert elsewhere["miss"] > 0 and elsewhere["hit"] == 0, elsewhere
    assert len(list((tmp_path / "compile-cache").iterdir())) == 2


def test_warm_workers_restart_with_the_runs_kernels(tmp_path: Path) -> None:
    """Two warm launches (workers forked from a server that imported torch once) of a
    compiled model, the second as a restart on a new node with its own empty /tmp: it
    reuses the run's kernels. (The server's torch wrote its own cache folder into the
    server's environment, which a fork would take for the user's choice.)"""
    runs = []
    for epochs in (1, 2):
        node = tmp_path / f"n{epochs}"
        node.mkdir()
        env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
        command = [sys.executable, "-m", "ddpkit", "run", "--nproc", "1", "--run-path",
                   "--start-method", "forkserver", str(SCRIPTS / "compiled_resume.py"),
                   str(tmp_path / "run"), str(epochs)]  # fmt: skip
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=200,
                              env={**env, "TMPDIR": str(node)})  # fmt: skip
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-3000:]
        assert "workers forked from a server that imported torch once" in out, out[-3000:]
        line = next(x for x in out.splitlines() if "cache {" in x)
        runs.append(json.loads(line.split("cache ", 1)[1]))
    assert runs[0]["miss"] > 0, runs  # the first run compiles
    assert runs[1]["hit"] > 0 and runs[1]["miss"] == 0, runs  # the restart loads
