"""Activation checkpointing in one process: which blocks are wrapped, that the gradients are
the same bit for bit, that fewer activations are kept, and the refusals."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import ddpkit
from ddpkit.errors import ConfigError
from ddpkit.parallel.fsdp import unit_modules
from ddpkit.parallel.recompute import checkpoint_blocks, unit_of


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def deep(blocks: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(Block() for _ in range(blocks)), nn.Linear(16, 2))


def gradients_and_kept_bytes(model: nn.Module) -> tuple[dict[str, torch.Tensor], int]:
    kept = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        kept.append(t.numel() * t.element_size())
        return t

    torch.manual_seed(1)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(torch.randn(32, 16)).square().sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, sum(kept)


def test_recomputed_blocks_give_the_same_gradients_and_keep_fewer_activations() -> None:
    plain, recomputed = deep(), deep()
    assert checkpoint_blocks(recomputed, (Block,)) == 4
    assert list(recomputed.state_dict()) == list(plain.state_dict())  # checkpoints unchanged
    recomputed.load_state_dict(plain.state_dict())
    plain_grads, plain_kept = gradients_and_kept_bytes(plain)
    grads, kept = gradients_and_kept_bytes(recomputed)
    names = [name.replace("._checkpoint_wrapped_module", "") for name in grads]
    assert names == list(plain_grads)
    assert all(torch.equal(g, plain_grads[n]) for n, g in zip(names, grads.values(), strict=True))
    assert kept < plain_kept / 2, (kept, plain_kept)


def test_every_second_block_and_the_fsdp_units_they_become() -> None:
    model = deep()
    assert checkpoint_blocks(model, (Block,), every=2) == 2
    wrapped = [i for i, m in enumerate(model) if unit_of(m) is not m]
    assert wrapped == [0, 2]
    units = unit_modules(model, [Block])
    assert [type(unit_of(u)).__name__ for u in units] == ["Block"] * 4
    assert units[0] is model[0] and units[1] is model[1]  # the wrapper stands for its block


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"activation_checkpointing": True}, "activation_checkpointing=True recomputes the FSDP "
         "units, and this strategy has none: name the block classes"),
        ({"activation_checkpointing": ("Block",)}, "blocks takes a tuple of nn.Module classes"),
        ({"activation_checkpointing": ddpkit.ActivationCheckpointing(blocks=(Block,))}, None),
        ({"activation_checkpointing": (nn.Conv2d,)}, "the model has no Conv2d module"),
    ],
    ids=["true-without-units", "a-name", "fine", "absent-class"],
)  # fmt: skip
def test_requests_that_cannot_be_met_are_refused_with_the_fix(
    options: dict[str, object], said: str | None
) -> None:
    ddpkit.init(hang_timeout=0)
    if said is None:
        ddpkit.prepare_model(deep(), "none", **options)  # type: ignore[arg-type]
        return
    with pytest.raises(ddpkit.ConfigError, match=re.escape(said)):
        ddpkit.prepare_model(deep(), "none", **options)  # type: ignore[arg-type]


def test_every_is_a_positive_whole_number() -> None:
    with pytest.raises(
        ddpkit.ConfigError,
        match=re.escape(
            "ActivationCheckpointing(every=) must be a positive whole number (1: every block"
        ),
    ):
        ddpkit.ActivationCheckpointing(blocks=(Block,), every=0)


def test_true_recomputes_the_fsdp_units() -> None:
    ddpkit.init(hang_timeout=0)
    fsdp = ddpkit.FSDPStrategy(units=(Block,))
    model = ddpkit.prepare_model(deep(), fsdp, activation_checkpointing=True)
    assert sum(unit_of(m) is not m for m in model) == 4


def test_every_second_of_the_fsdp_units_by_one_value() -> None:
    ddpkit.init(hang_timeout=0)
    fsdp = ddpkit.FSDPStrategy(units=(Block,))
    every_second = ddpkit.ActivationCheckpointing(every=2)  # no blocks: the strategy's units
    model = ddpkit.prepare_model(deep(), fsdp, activation_checkpointing=every_second)
    assert [i for i, m in enumerate(model) if unit_of(m) is not m] == [0, 2]


def test_options_are_given_by_name_as_a_strategys_are() -> None:
    with pytest.warns(
        FutureWarning, match=r"write ActivationCheckpointing\(blocks=..., every=...\)"
    ):
        old = ddpkit.ActivationCheckpointing((Block,), 2)
    assert old == ddpkit.ActivationCheckpointing(blocks=(Block,), every=2)
    with pytest.raises(ConfigError, match="ActivationCheckpointing has no option 'evry'"):
        ddpkit.ActivationCheckpointing(evry=2)
    with pytest.raises(ConfigError, match="every"):
        ddpkit.ActivationCheckpointing(blocks=(Block,), every="2")
