"""An epoch's metric sums: the names agreed on the epoch before cost no agreement (one
all-reduce carries a flag instead); a changed set of names is agreed on again."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ddpkit.train.steps as steps
from ddpkit.train.steps import MetricSums

CPU = torch.device("cpu")


def test_names_agreed_on_last_epoch_are_not_agreed_on_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gathered: list[int] = []
    real = steps.all_gather_rows

    def counting(rows: torch.Tensor) -> Any:
        gathered.append(1)
        return real(rows)

    monkeypatch.setattr(steps, "all_gather_rows", counting)
    first = MetricSums(CPU)
    first.add({"loss": 1.0}, samples=2)
    assert first.reduced_sums() == (["loss"], [2.0, 2.0]) and len(gathered) == 1
    second = MetricSums(CPU, agreed=first.agreed)  # the next epoch
    second.add({"loss": 3.0}, samples=2)
    assert second.reduced_sums() == (["loss"], [2.0, 6.0]) and len(gathered) == 1
    third = MetricSums(CPU, agreed=second.agreed)  # a name more: agreed on again
    third.add({"loss": 1.0, "accuracy": 0.5}, samples=2)
    assert third.reduced_sums() == (["loss", "accuracy"], [2.0, 2.0, 1.0])
    assert len(gathered) == 2
    fourth = MetricSums(CPU, agreed=third.agreed)  # a name fewer: not reported as 0
    fourth.add({"loss": 1.0}, samples=2)
    assert fourth.reduce() == {"loss": 1.0, "samples": 2.0} and len(gathered) == 3
