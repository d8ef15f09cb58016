"""Gathering over 2 gloo ranks: exactly what one process computes, whatever the sharding."""

from __future__ import annotations

import pytest
import torch

import ddpkit
from helpers import mp_workers

pytestmark = pytest.mark.multiproc


def single_process_order(n: int, shuffle: bool) -> list[float]:
    ddpkit.init(hang_timeout=0, seed=3)
    data = torch.utils.data.TensorDataset(torch.arange(float(n)))
    loader = ddpkit.prepare_loader(data, batch_size=2, shuffle=shuffle)
    order = [float(v) * 10 for (x,) in loader for v in x]
    ddpkit.shutdown()
    return order


@pytest.mark.parametrize("shuffle", [False, True])
def test_gather_for_metrics_over_2_ranks_equals_one_process_on_7_samples(shuffle: bool) -> None:
    rank0, rank1 = ddpkit.spawn(mp_workers.gathered_for_metrics, 2, 7, shuffle)
    expected = single_process_order(7, shuffle)
    assert rank0["preds"] == rank1["preds"] == expected  # 7 rows: the repeat is gone
    assert rank0["labels"] == [int(v / 10) % 3 for v in expected]
    assert rank0["uneven"] == [[0, 0], [1, 1], [1, 1]]  # 1 row from rank 0, 2 from rank 1
    assert "rank 0: float32[N, 2]; rank 1: float32[N, 3]" in rank0["mismatch"]
    # Names only one rank reported are agreed on; weights: 1 sample on rank 0, 2 on rank 1.
    assert rank0["metrics"] == rank1["metrics"] == {
        "loss": pytest.approx(5 / 3), "samples": 3.0, "only_rank0": pytest.approx(1 / 3),
        "only_rank1": pytest.approx(2 / 3),
    }  # fmt: skip
