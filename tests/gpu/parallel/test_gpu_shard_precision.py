"""GPU tier: FSDP's bf16 mixed-precision policy over NCCL (skipped without a GPU)."""

from __future__ import annotations

import ddpkit
from helpers import strategy_workers as workers
from helpers.gpus import needs_gpus

pytestmark = needs_gpus(1)


def test_a_bf16_policy_computes_in_bf16_on_the_gpu() -> None:
    [rank0] = ddpkit.spawn(workers.sharded_with_policy, 1, "fsdp", "bf16")
    assert rank0["device"].startswith("cuda")
    assert rank0["computed"] == ["torch.bfloat16"] and rank0["params"] == ["torch.float32"]
    assert "training FSDP (bf16 parameters, fp32 reduction)" in rank0["startup"]
