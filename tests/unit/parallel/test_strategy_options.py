"""A strategy's options live on its object: ``prepare_model(model, ddpkit.FSDPStrategy(...))``.
The names are shorthands for the defaults, the old keywords are refused with the new call,
and a wrapped model answers with the object that wrapped it (a group of one, no processes)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import ddpkit
from ddpkit.parallel.strategy import STRATEGIES, resolve_strategy, strategy_of


@pytest.fixture(autouse=True)
def shut_down() -> Iterator[None]:
    yield
    ddpkit.shutdown()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def test_a_name_is_its_strategy_with_the_defaults() -> None:
    assert resolve_strategy("ddp") == ddpkit.DDPStrategy()
    assert resolve_strategy("fsdp") == ddpkit.FSDPStrategy()
    assert resolve_strategy("hsdp") == ddpkit.HSDPStrategy()
    given = ddpkit.FSDPStrategy(units=[Block])  # a list is kept as a tuple
    assert resolve_strategy(given) is given and given.units == (Block,)
    assert [resolve_strategy(name).name for name in STRATEGIES] == list(STRATEGIES)


def test_an_unknown_strategy_lists_the_names_and_the_objects() -> None:
    said = "unknown strategy 'zero3'; choose one of 'ddp', 'fsdp', 'hsdp', 'dp', 'none', or a"
    with pytest.raises(ddpkit.ConfigError, match=re.escape(said)):
        resolve_strategy("zero3")


def test_repr_shows_the_options_given() -> None:
    assert repr(ddpkit.DDPStrategy()) == "DDPStrategy()"
    fsdp = ddpkit.FSDPStrategy(units=(Block,), mixed_precision="bf16")
    assert repr(fsdp) == "FSDPStrategy(units=(Block,), mixed_precision='bf16')"
    hsdp = ddpkit.HSDPStrategy(shard_size=2, reshard_after_forward=False)
    assert repr(hsdp) == "HSDPStrategy(reshard_after_forward=False, shard_size=2)"


def test_ddp_is_given_only_the_options_that_differ_from_torchs_defaults() -> None:
    assert ddpkit.DDPStrategy()._torch_options() == {}
    ddp = ddpkit.DDPStrategy(bucket_cap_mb=50, static_graph=True, comm_hook="bf16")
    assert ddp._torch_options() == {"bucket_cap_mb": 50, "static_graph": True}


@pytest.mark.parametrize(
    ("strategy", "old", "new"),
    [
        ("fsdp", {"mixed_precision": "bf16"},
         "Write prepare_model(model, ddpkit.FSDPStrategy(mixed_precision='bf16'))"),
        ("fsdp", {"fsdp_units": (Block,)},
         "Write prepare_model(model, ddpkit.FSDPStrategy(units=(Block,)))"),
        ("hsdp", {"hsdp_shard_size": 2, "fsdp_units": [Block]},
         "Write prepare_model(model, ddpkit.HSDPStrategy(shard_size=2, units=[Block]))"),
        ("ddp", {"bucket_cap_mb": 50, "comm_hook": "bf16"},
         "Write prepare_model(model, ddpkit.DDPStrategy(bucket_cap_mb=50, comm_hook='bf16'))"),
        ("fsdp", {"static_graph": True},
         "ddpkit.DDPStrategy(static_graph=True)) (static_graph belongs to DDPStrategy, not to "
         "'fsdp')"),
        ("none", {"activation_checkpointing_every": 2},
         "Write prepare_model(model, 'none', activation_checkpointing=ddpkit."
         "ActivationCheckpointing(blocks=(Block,), every=2))"),
    ],
    ids=["mixed-precision", "units", "hsdp", "ddp", "misplaced", "every"],
)  # fmt: skip
def test_an_old_keyword_is_refused_with_the_new_call(strategy: str, old: dict, new: str) -> None:
    ddpkit.init(hang_timeout=0)
    with pytest.raises(ddpkit.ConfigError) as refused:
        ddpkit.prepare_model(nn.Sequential(Block()), strategy, activation_checkpointing=(Block,),
                             **old)  # fmt: skip
    assert str(refused.value).startswith(f"prepare_model() no longer takes {', '.join(old)}:")
    assert new in str(refused.value)


def test_a_keyword_prepare_model_never_had_lists_its_keywords() -> None:
    ddpkit.init(hang_timeout=0)
    said = ("prepare_model() has no keyword 'bucket'; its keywords: strategy, sync_batchnorm, "
            "compile, activation_checkpointing, weights")  # fmt: skip
    with pytest.raises(ddpkit.ConfigError, match=re.escape(said)):
        ddpkit.prepare_model(nn.Linear(2, 2), bucket=3)


def test_options_are_given_by_name() -> None:
    with pytest.raises(ddpkit.ConfigError, match=re.escape("takes its options by name, e.g. "
                                                           "FSDPStrategy(units=...)")):  # fmt: skip
        ddpkit.FSDPStrategy((Block,))  # type: ignore[misc]


def test_the_wrapped_model_answers_with_the_object_that_wrapped_it(tmp_path: Path) -> None:
    ddpkit.init(init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1, hang_timeout=0)
    ddp = ddpkit.DDPStrategy(static_graph=True, bucket_cap_mb=1)
    model = ddpkit.prepare_model(nn.Linear(3, 2), ddp)
    assert strategy_of(model) is ddp and model.static_graph  # torch got the option
    fsdp = ddpkit.FSDPStrategy(units=(Block,), reshard_after_forward=False)
    sharded = ddpkit.prepare_model(nn.Sequential(Block(), Block()), fsdp)
    assert strategy_of(sharded) is fsdp


def test_every_ddp_option_reaches_torch(tmp_path: Path) -> None:
    """Each option given is the one torch's DDP runs with (none dropped on the way)."""
    ddpkit.init(init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1, hang_timeout=0)
    given = ddpkit.DDPStrategy(bucket_cap_mb=3, find_unused_parameters=True,
                               gradient_as_bucket_view=True, broadcast_buffers=False)  # fmt: skip
    model = ddpkit.prepare_model(nn.Linear(3, 2), given)
    assert model.bucket_bytes_cap == 3 * 1024 * 1024
    assert model.find_unused_parameters and model.gradient_as_bucket_view
    assert model.broadcast_buffers is False
    plain = ddpkit.prepare_model(nn.Linear(3, 2))
    assert plain.bucket_bytes_cap == 25 * 1024 * 1024 and not plain.find_unused_parameters


@pytest.mark.parametrize("reshard", [True, False])
def test_the_fsdp_units_and_resharding_reach_torch(tmp_path: Path, reshard: bool) -> None:
    """``units`` become FSDP units of their own; ``reshard_after_forward`` decides whether a
    unit's parameters are sharded again after its forward (DTensors) or stay gathered."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    ddpkit.init(init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1, hang_timeout=0)
    fsdp = ddpkit.FSDPStrategy(units=(Block,), reshard_after_forward=reshard)
    model = ddpkit.prepare_model(nn.Sequential(Block(), Block(), nn.Linear(4, 4)), fsdp)
    assert [isinstance(m, FSDPModule) for m in model] == [True, True, False]
    model(torch.ones(2, 4))  # the first unit is not the root: its resharding is the option's
    assert isinstance(next(model[0].parameters()), DTensor) is reshard
