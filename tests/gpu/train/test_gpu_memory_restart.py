"""GPU tier: a memory snapshot taken from GPU memory (the state copied into /dev/shm after
every step) resumes a killed worker bit-identical to an uninterrupted run, on CUDA with NCCL:
one worker, killed with SIGKILL mid-epoch, restarted by torch's agent."""

from __future__ import annotations

from pathlib import Path

import torch

from helpers.gpus import needs_gpus
from helpers.launch_helpers import SCRIPTS, ddpkit_cli

pytestmark = needs_gpus(1)


def train(out: Path, *kill: str) -> str:
    out.mkdir()
    done = ddpkit_cli("run", "--nproc", "1", "--max-restarts", "1",
                      str(SCRIPTS / "memory_restart.py"), str(out), *kill,
                      timeout=240)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "backend nccl" in output, output
    return output


def test_a_snapshot_from_gpu_memory_resumes_bit_identical(tmp_path: Path) -> None:
    train(tmp_path / "uninterrupted")
    output = train(tmp_path / "killed", "57")
    assert "resumed from memory at step 57" in output and "0 completed step(s) lost" in output
    expected = torch.load(tmp_path / "uninterrupted" / "final.pt", weights_only=True)
    final = torch.load(tmp_path / "killed" / "final.pt", weights_only=True)
    for name, tensor in expected["weights"].items():
        assert torch.equal(final["weights"][name], tensor), name  # bit for bit
    assert [e["loss"] for e in final["history"]] == [e["loss"] for e in expected["history"]]
