"""FSDP's mixed-precision policy on 2 gloo workers: bf16 compute, fp32 sharded parameters and
reduction, said in the start-up line, and training close to fp32's but not equal to it."""

from __future__ import annotations

import pytest

import ddpkit
from helpers import strategy_workers as workers
from helpers.mp_workers import max_abs_diff

pytestmark = pytest.mark.multiproc


def test_a_bf16_policy_computes_in_bf16_and_keeps_fp32_shards() -> None:
    policy = ddpkit.spawn(workers.sharded_with_policy, 2, "fsdp", "bf16")
    plain = ddpkit.spawn(workers.sharded_with_policy, 2, "fsdp", None)
    assert policy[0]["startup"].startswith(
        "training FSDP (bf16 parameters, fp32 reduction); global batch 8 = 4 per device x 2"
    )
    assert policy[0]["startup"].split("; ")[3] == "bf16"  # counted as bf16 (verify's bounds)
    assert policy[0]["computed"] == ["torch.bfloat16"] and plain[0]["computed"] == ["torch.float32"]
    assert policy[0]["params"] == ["torch.float32"]  # the shards Adam updates stay fp32
    assert max_abs_diff(policy[0]["state"], policy[1]["state"]) == 0.0
    difference = max_abs_diff(policy[0]["state"], plain[0]["state"])
    assert 0.0 < difference < 0.05, difference  # bf16's rounding, not another computation


def test_hsdp_says_its_mesh_and_its_policy() -> None:
    ranks = ddpkit.spawn(workers.sharded_with_policy, 4, "hsdp", "bf16")
    said = "training HSDP (1 replica x 4 shards; bf16 parameters, fp32 reduction)"
    assert ranks[0]["startup"].startswith(said)
    assert ranks[0]["computed"] == ["torch.bfloat16"]
