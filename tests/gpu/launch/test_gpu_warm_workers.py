"""GPU tier: warm workers (``ddpkit run --run-path --start-method forkserver``) on CUDA. The
server that imports torch never initialises CUDA, so a worker forked from it may (a CUDA
context does not survive a fork); each worker then reduces on its GPU over NCCL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.gpus import needs_gpus
from helpers.launch_helpers import SCRIPTS, ddpkit_cli

pytestmark = needs_gpus(1)


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_warm_worker_starts_without_cuda_and_reduces_on_its_gpu(method: str) -> None:
    done = ddpkit_cli("run", "--nproc", "1", "--run-path", "--start-method", method,
                      str(SCRIPTS / "run_path_endings.py"), "cuda", timeout=170)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "cuda initialised before the script: False" in out
    assert "backend nccl" in out


def test_a_compiled_model_restarts_warm_on_cuda_with_its_kernels(tmp_path: Path) -> None:
    """Two warm launches of a compiled model on CUDA, the second as a restart on a new node
    (its own empty /tmp): it reuses the run's kernels (FX graph cache hits, none compiled)."""
    runs = []
    for epochs in (1, 2):
        node = tmp_path / f"node-{epochs}"
        node.mkdir()
        done = ddpkit_cli("run", "--nproc", "1", "--run-path", "--start-method", "forkserver",
                          str(SCRIPTS / "compiled_resume.py"), str(tmp_path / "run"),
                          str(epochs), timeout=300, env={"TMPDIR": str(node)})  # fmt: skip
        out = done.stdout + done.stderr
        assert done.returncode == 0 and "backend nccl" in out, out
        assert "workers forked from a server that imported torch once" in out, out
        line = next(x for x in out.splitlines() if "cache {" in x)
        runs.append(json.loads(line.split("cache ", 1)[1]))
    assert runs[0]["miss"] > 0, runs  # the first run compiles
    assert runs[1]["hit"] > 0 and runs[1]["miss"] == 0, runs  # the restart loads
