"""GPU tier: NCCL paths, run only where CUDA GPUs are present (skipped elsewhere)."""

from __future__ import annotations

import ddpkit
from helpers import mp_workers
from helpers.gpus import needs_gpus

pytestmark = needs_gpus(2)


def test_sync_batchnorm_converts_on_gpus() -> None:
    assert ddpkit.spawn(mp_workers.batchnorm_types, 2, True) == [["SyncBatchNorm"]] * 2


def test_nccl_is_chosen_and_all_reduce_works() -> None:
    results = ddpkit.spawn(mp_workers.world_fields, 2)
    assert [r["sum_of_ranks"] for r in results] == [1.0, 1.0]
