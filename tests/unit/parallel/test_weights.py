"""Weights from a file into a model built on the meta device, in one process: the values
arrive bit for bit from every kind of file, ties stay tied, and what cannot work is refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import ddpkit
from ddpkit.parallel.weights import on_meta
from helpers.strategy_workers import load_example

GPT = load_example("gpt")


def built(seed: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    return GPT.GPT(GPT.GPTConfig())


def on_meta_device() -> nn.Module:
    with torch.device("meta"):
        return GPT.GPT(GPT.GPTConfig())


def plain(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}


def write(kind: str, model: nn.Module, folder: Path) -> Path:
    state = plain(model.state_dict())
    if kind == "safetensors":
        path = folder / "gpt.safetensors"
        save_file(state, str(path))
    elif kind == "pt":
        path = folder / "gpt.pt"
        torch.save(state, path)
    elif kind == "tied-once":  # as Hugging Face saves a tied head: one of the two names
        path = folder / "gpt.safetensors"
        save_file({k: v for k, v in state.items() if k != "head.weight"}, str(path))
    elif kind == "hf-folder":  # two shards and their index
        path = folder / "hf"
        path.mkdir()
        names = sorted(state)
        halves = {"model-00001-of-00002.safetensors": names[::2],
                  "model-00002-of-00002.safetensors": names[1::2]}  # fmt: skip
        for file, part in halves.items():
            save_file({k: state[k] for k in part}, str(path / file))
        index = {"weight_map": {k: f for f, part in halves.items() for k in part}}
        (path / "model.safetensors.index.json").write_text(json.dumps(index))
    else:  # a ddpkit checkpoint: its "model" entry
        path = ddpkit.checkpoint.save_checkpoint({"model": state, "epoch": 1}, folder, 1)
    return path


@pytest.mark.parametrize("kind", ["safetensors", "pt", "tied-once", "hf-folder", "checkpoint"])
def test_a_model_on_the_meta_device_gets_the_files_weights_bit_for_bit(
    tmp_path: Path, kind: str
) -> None:
    ddpkit.init(hang_timeout=0)
    source = built()
    model = ddpkit.prepare_model(on_meta_device(), "ddp", weights=write(kind, source, tmp_path))
    assert not on_meta(model)
    loaded = model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in source.state_dict().items())
    assert model.head.weight is model.tokens.weight  # the tie survived


def test_a_built_model_takes_weights_too(tmp_path: Path) -> None:
    ddpkit.init(hang_timeout=0)
    path = write("safetensors", built(seed=5), tmp_path)
    model = ddpkit.prepare_model(built(seed=6), "none", weights=path)
    assert torch.equal(model.tokens.weight, built(seed=5).tokens.weight)


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("no-weights", "the model is on the meta device (built under torch.device('meta')): it "
                       "has shapes but no values. Pass the weights"),
        ("missing", "has no tensor for blocks.0.ln_1.bias of the model"),
        ("shape", "gpt.safetensors: positions.weight has shape (8, 96), the model's is (64, 96)"),
        ("unsaved-buffer", "buffer(s) 1.mask are on the meta device and not saved in a state "
                           "dict (persistent=False)"),
        ("absent", "does not exist"),
    ],
)  # fmt: skip
def test_what_cannot_start_is_refused_with_the_fix(tmp_path: Path, case: str, said: str) -> None:
    ddpkit.init(hang_timeout=0)
    model, weights = on_meta_device(), None
    state = plain(built().state_dict())
    if case == "missing":
        del state["blocks.0.ln_1.bias"]
    if case == "shape":
        state["positions.weight"] = state["positions.weight"][:8].clone()
    if case in ("missing", "shape"):
        weights = tmp_path / "gpt.safetensors"
        save_file(state, str(weights))
    if case == "unsaved-buffer":
        with torch.device("meta"):
            model = nn.Sequential(nn.Linear(2, 2), nn.Module())
            model[1].register_buffer("mask", torch.ones(2), persistent=False)
        weights = tmp_path / "unused.pt"
    if case == "absent":
        weights = tmp_path / "nothing-here.safetensors"
    with pytest.raises(ddpkit.ConfigError, match=re.escape(said)):
        ddpkit.prepare_model(model, "none", weights=weights)


def test_tensors_the_model_lacks_are_named_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ddpkit.init(hang_timeout=0)
    state = {**plain(built().state_dict()), "extra.weight": torch.ones(2)}
    save_file(state, str(tmp_path / "gpt.safetensors"))
    ddpkit.prepare_model(on_meta_device(), "none", weights=tmp_path / "gpt.safetensors")
    assert "holds 1 tensor(s) the model does not have, left out: extra.weight" in caplog.text
