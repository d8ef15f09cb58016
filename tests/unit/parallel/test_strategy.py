"""The strategy descriptors: one answers for each kind of wrapped model."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
from torch import nn

import ddpkit
from ddpkit.parallel.strategy import STRATEGIES, get_strategy, strategy_of


def test_every_strategy_name_has_a_descriptor_of_that_name() -> None:
    assert [get_strategy(name).name for name in STRATEGIES] == list(STRATEGIES)


@pytest.mark.parametrize(
    ("name", "identical", "checkpoint", "uneven"),
    [
        ("ddp", True, "whole", "join"),
        ("fsdp", False, "sharded", "refuse"),
        ("hsdp", False, "sharded", "refuse"),
        ("dp", True, "whole", "free"),
        ("none", True, "whole", "free"),
    ],
)
def test_descriptors_answer_what_the_trainer_asks(
    name: str, identical: bool, checkpoint: str, uneven: str
) -> None:
    strategy = get_strategy(name)
    assert (strategy.replicas_identical, strategy.checkpoint_kind, strategy.uneven_batches) == (
        identical,
        checkpoint,
        uneven,
    )


def test_a_wrapped_model_is_owned_by_its_strategy() -> None:
    plain = nn.Linear(2, 2)
    assert strategy_of(plain).name == "none"
    assert strategy_of(nn.DataParallel(plain)).name == "dp"
    assert strategy_of(plain).unwrap(plain) is plain
    assert get_strategy("dp").unwrap(nn.DataParallel(plain)) is plain


def test_prepare_model_in_a_world_of_one_leaves_the_model_unwrapped() -> None:
    ddpkit.init(hang_timeout=0)
    for name in ("ddp", "fsdp", "hsdp", "none"):
        model = ddpkit.prepare_model(nn.Linear(2, 2), strategy=name)  # type: ignore[arg-type]
        assert strategy_of(model).name == "none" and isinstance(model, nn.Linear)


def test_choosing_ddp_does_not_import_fsdp() -> None:
    # Not building a torch optimizer here: torch.optim's constructor imports torch._dynamo,
    # which imports FSDP itself, under any launcher.
    code = (
        "import sys, torch, ddpkit; ddpkit.init(hang_timeout=0); "
        "m = ddpkit.prepare_model(torch.nn.Linear(2, 2)); ddpkit.Trainer; ddpkit.prepare_loader; "
        "print(sorted(n for n in sys.modules if n.startswith(('torch.distributed.fsdp', "
        "'torch.distributed.tensor', 'torch.distributed.checkpoint', 'ddpkit.tools'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_ddp_model_is_ddp_when_torch_wraps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    ddp = get_strategy("ddp")
    fake = torch.nn.parallel.DistributedDataParallel.__new__(
        torch.nn.parallel.DistributedDataParallel
    )
    assert ddp.owns(fake) and strategy_of(fake).name == "ddp"


@pytest.mark.parametrize(
    ("shard_size", "said"),
    [
        (
            3,
            "shard_size=3 does not divide the world of 4 ranks: each replica needs the same "
            "number of shards. Use one of 1, 2, 4",
        ),
        (0, "shard_size must be a positive whole number; got 0"),
        (True, "shard_size must be a positive whole number; got True"),
    ],
    ids=["three-of-four", "zero", "a-bool"],
)
def test_an_hsdp_shard_size_that_cannot_tile_the_world_is_refused(
    shard_size: int, said: str
) -> None:
    from ddpkit.parallel.hsdp import hybrid_shape

    with pytest.raises(ddpkit.ConfigError, match=re.escape(said)):
        hybrid_shape(4, shard_size)
    assert hybrid_shape(8, 4) == (2, 4) and hybrid_shape(4, 1) == (4, 1)


def test_the_hsdp_shard_size_is_refused_for_another_strategy() -> None:
    said = "FSDPStrategy has no option 'shard_size' (HSDPStrategy has); its options: units, "
    with pytest.raises(ddpkit.ConfigError, match=re.escape(said)):
        ddpkit.FSDPStrategy(shard_size=2)  # type: ignore[call-arg]
    with pytest.raises(ddpkit.ConfigError, match=r"shard_size takes an integer >= 1 \(ranks\)"):
        ddpkit.HSDPStrategy(shard_size=0)


@pytest.mark.parametrize(
    ("strategy", "request_", "said"),
    [
        ("FSDPStrategy", "fp16", 'mixed_precision="fp16" would compute in fp16 without loss'),
        ("HSDPStrategy", "int8", 'mixed_precision must be "bf16", "fp32" or a torch MixedPrec'),
        ("DDPStrategy", "bf16",
         "DDPStrategy has no option 'mixed_precision' (FSDPStrategy and HSDPStrategy have)"),
    ],
    ids=["fp16", "unknown", "on-ddp"],
)  # fmt: skip
def test_a_mixed_precision_policy_that_cannot_be_had_is_refused(
    strategy: str, request_: str, said: str
) -> None:
    with pytest.raises(ddpkit.ConfigError, match=re.escape(said)):
        getattr(ddpkit, strategy)(mixed_precision=request_)  # before any model is touched


def test_hsdp_over_gloo_is_refused_where_torch_cannot_average_on_gloo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.distributed.fsdp import FSDPModule

    from ddpkit.parallel.hsdp import check_backend

    if hasattr(FSDPModule, "set_force_sum_reduction_for_comms"):  # torch 2.13 can; 2.7 not
        check_backend("gloo")
    monkeypatch.delattr(FSDPModule, "set_force_sum_reduction_for_comms", raising=False)
    with pytest.raises(ddpkit.ConfigError, match=r"over gloo needs a newer torch than .* On CPU"):
        check_backend("gloo")
    check_backend("nccl")
