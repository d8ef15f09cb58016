"""Collective helpers: results come back on the input's device, whatever the collective's."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ddpkit.runtime.collectives as collectives


@pytest.fixture
def collective_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks whose collectives run on another device than the caller's tensors (as NCCL
    runs on the rank's GPU): "meta" stands in for it; a sum over the ranks doubles."""
    monkeypatch.setattr(collectives, "_group_active", lambda: True)
    monkeypatch.setattr(collectives.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(collectives, "_as_tensor", lambda v: torch.as_tensor(v).to("meta"))

    def summed_over_two_ranks(value: Any, op: Any, name: str) -> Any:
        return value * 2  # on its argument's device, as the real one moves it back

    monkeypatch.setattr(collectives, "_all_reduce", summed_over_two_ranks)


@pytest.mark.usefixtures("collective_elsewhere")
def test_all_reduce_mean_returns_on_the_inputs_device() -> None:
    value = torch.tensor([1.0, 3.0])
    mean = collectives.all_reduce_mean(value)
    assert mean.device == value.device  # before the fix: on the collective's device (meta)
    assert mean.tolist() == [1.0, 3.0]


@pytest.mark.usefixtures("collective_elsewhere")
def test_all_reduce_mean_of_a_float_is_a_float() -> None:
    assert collectives.all_reduce_mean(2.5) == 2.5
