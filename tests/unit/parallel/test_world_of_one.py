"""A world of one with a process group (``ddpkit run --nproc 1``, or the tutorials'
``init_method`` with ``world_size=1``) wraps as N ranks do, so one GPU runs DDP's and FSDP's
path; a process without a group leaves the model unwrapped (no processes started here)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule

import ddpkit
from ddpkit.parallel.strategy import strategy_of


@pytest.fixture(autouse=True)
def shut_down() -> Iterator[None]:
    yield
    ddpkit.shutdown()  # the group of one: the clean-up check wants none left


def group_of_one(tmp_path: Path) -> None:
    ddpkit.init(init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1, hang_timeout=0)


HSDP_ON_GLOO = pytest.mark.skipif(
    not hasattr(FSDPModule, "set_force_sum_reduction_for_comms"),
    reason="this torch's HSDP cannot average over gloo, and says so (test_strategy.py)",
)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", pytest.param("hsdp", marks=HSDP_ON_GLOO)])
def test_a_group_of_one_wraps_and_no_group_does_not(tmp_path: Path, strategy: str) -> None:
    ddpkit.init(hang_timeout=0)
    assert strategy_of(ddpkit.prepare_model(torch.nn.Linear(3, 2), strategy)).name == "none"
    ddpkit.shutdown()
    group_of_one(tmp_path)
    assert strategy_of(ddpkit.prepare_model(torch.nn.Linear(3, 2), strategy)).name == strategy


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_compiled_wrapped_model_accumulates_gradients(tmp_path: Path, strategy: str) -> None:
    """Accumulation keeps gradients local through the strategy's no_sync, which must find DDP
    (or FSDP) inside torch.compile's wrapper (it asserted on the wrapper and failed)."""
    group_of_one(tmp_path)
    torch.manual_seed(0)
    model = ddpkit.prepare_model(torch.nn.Linear(4, 3), strategy, compile={"backend": "eager"})
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,)))
    trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                             F.cross_entropy, accumulate=2)  # fmt: skip
    trainer.fit(ddpkit.prepare_loader(data, batch_size=4), epochs=1)
    assert trainer.step == 2
