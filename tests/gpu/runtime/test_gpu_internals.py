"""GPU tier: the private internals ddpkit reaches for (ddpkit._compat) are where it looks on
this image's CUDA build of torch (NCCL's Flight Recorder among them, which CPU builds lack),
and a strategy object's options reach torch's DDP over NCCL (skipped without a GPU)."""

from __future__ import annotations

import ddpkit
from ddpkit._core.torchversion import torch_at_least
from helpers import mp_workers
from helpers.gpus import needs_gpus

pytestmark = needs_gpus(1)


def test_ddpkits_internals_are_found_on_this_cuda_build() -> None:
    (found,) = ddpkit.spawn(mp_workers.cuda_internals, 1)
    assert found["backend"] == "nccl", found
    assert "_dump_nccl_trace" in found["dumpers"], found
    assert found["headers"] == torch_at_least("2.8") and found["counts"], found
    assert "torchinductor" in found["cache"], found
    assert found["ddp"] == [3 * 1024 * 1024, True, True], found
