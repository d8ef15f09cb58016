"""The parts of examples/gpt.py and examples/gan.py, in one process."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from helpers.launch_helpers import REPO

sys.path.insert(0, str(REPO / "examples"))
import gan
import gpt


def test_the_gpt_is_an_hf_style_causal_lm_starting_near_uniform() -> None:
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig())
    train, val = gpt.load_text(64)
    batch = torch.utils.data.default_collate([train[0], train[1]])
    assert batch["input_ids"].shape == (2, 64) and torch.equal(
        batch["labels"][0, :-1], batch["input_ids"][0, 1:]
    )
    out = model(**batch)
    assert out.logits.shape == (2, 64, 256)
    assert out.loss.item() == pytest.approx(math.log(256), abs=0.05)  # small init: near uniform
    assert 300_000 < sum(p.numel() for p in model.parameters()) < 400_000
    assert len(train) > 9 * len(val) > 0


def test_the_schedule_warms_up_then_decays_to_a_tenth() -> None:
    factor = gpt.cosine_with_warmup(warmup=10, total=110)
    assert factor(0) == pytest.approx(0.1) and factor(9) == pytest.approx(1.0)
    assert factor(60) == pytest.approx(0.55) and factor(110) == pytest.approx(0.1)


def test_the_gan_data_carries_its_noise() -> None:
    first, again = gan.ring_data(16, seed=1), gan.ring_data(16, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(first.tensors, again.tensors, strict=True))
    real, z = first.tensors
    assert real.shape == (16, 2) and z.shape == (16, gan.LATENT)
    assert torch.cdist(real, gan.MODES).min(dim=1).values.max() < 0.3  # near a mode
