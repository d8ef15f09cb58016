"""torch.compile under DDP on 2 gloo workers (inductor, this machine's C compiler): verify
passes, and compiled and eager runs resume each other's checkpoints, whose keys are plain."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ddpkit.compiling.cache import RAN_EAGERLY
from helpers.launch_helpers import ddpkit_cli
from helpers.strategy_workers import load_wine

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]


def wine(folder: Path, epochs: int, *extra: str) -> str:
    done = ddpkit_cli("run", "--nproc", "2", "examples/wine.py", "--epochs", str(epochs),
                      "--checkpoint-dir", str(folder), "--save-every", "1", *extra,
                      timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_verify_passes_on_a_compiled_model() -> None:
    done = ddpkit_cli("verify", "examples/wine.py", "--compile", "--steps", "6", timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok    after 6 steps   4 tensors within" in done.stdout


def test_compiled_and_eager_runs_resume_each_others_checkpoints(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    first = wine(folder, 1, "--compile")
    # It did compile, on every rank: under DDP an nn.Sequential as the whole model ran eagerly
    # without a word (torch skips its frame), and this test passed all the same.
    assert len(re.findall(r"compiling included: 0 graph\(s\) from the compile cache, [1-9]",
                          first)) == 1 and RAN_EAGERLY not in first, first  # fmt: skip
    # The compiled run's checkpoint in a model that was never compiled (examples/wine.py's
    # make_model), without ddpkit.
    plain = load_wine().make_model()
    saved = torch.load(folder / "epoch_000001.pt", weights_only=True)
    plain.load_state_dict(saved["model"])  # strict: no "_orig_mod." or "module." prefix
    eager = wine(folder, 2)  # eager resumes the compiled run...
    assert "resumed from" in eager and "epoch 2/2" in eager
    compiled = wine(folder, 3, "--compile")  # ...and compiled resumes the eager one
    assert re.search(r"resumed from \S+epoch_000002\.pt", compiled) and "epoch 3/3" in compiled


def test_a_compiled_model_that_ran_eagerly_is_said_to(tmp_path: Path) -> None:
    script = tmp_path / "sequential.py"
    script.write_text(
        "import torch, ddpkit\n"
        "ddpkit.init()\n"
        "net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))\n"
        "model = ddpkit.prepare_model(net, compile={'backend': 'eager'})\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loop = ddpkit.TrainLoop({'model': model, 'optimizer': opt})\n"
        "for epoch in loop.epochs(1):\n"
        "    for x in loop.batches([torch.randn(2, 4)] * 2):\n"
        "        loop.backward(model(x).sum())\n"
        "        loop.optimizer_step()\n"
    )  # fmt: skip
    done = ddpkit_cli("run", "--nproc", "1", str(script), timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert RAN_EAGERLY in done.stdout + done.stderr
