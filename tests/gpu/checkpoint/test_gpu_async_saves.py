"""GPU tier, one GPU: background checkpoints from GPU memory (copied to pinned CPU memory),
killed with SIGKILL inside a write and resumed bit-identical, for DDP and FSDP.

The same job and checks as tests/multiproc/train/test_async_saves.py, on one GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.async_saves import kill_during_writes_then_finish, uninterrupted
from helpers.gpus import needs_gpus

pytestmark = needs_gpus(1)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_kill_inside_a_write_from_gpu_memory_resumes_bit_identical(
    tmp_path: Path, strategy: str
) -> None:
    reference = uninterrupted(tmp_path / "reference", strategy, nproc=1)
    kill_during_writes_then_finish(tmp_path, strategy, 1, reference, nproc=1)
