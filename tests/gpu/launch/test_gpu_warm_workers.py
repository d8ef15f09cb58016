"""GPU tier: warm workers (``ddpkit run --run-path --start-method forkserver``) on CUDA. The
server that imports torch never initialises CUDA, so a worker forked from it may (a CUDA
context does not survive a fork); each worker then reduces on its GPU over NCCL."""

from __future__ import annotations

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
