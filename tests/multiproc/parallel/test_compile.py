"""torch.compile under DDP on 2 gloo workers (inductor, this machine's C compiler): verify
passes, and compiled and eager runs resume each other's checkpoints, whose keys are plain."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from helpers.launch_helpers import ddpkit_cli

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
    wine(folder, 1, "--compile")
    # The compiled run's checkpoint in a model that was never compiled (examples/wine.py's
    # make_model), without ddpkit.
    nn = torch.nn
    plain = nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, 3))
    saved = torch.load(folder / "epoch_000001.pt", weights_only=True)
    plain.load_state_dict(saved["model"])  # strict: no "_orig_mod." or "module." prefix
    eager = wine(folder, 2)  # eager resumes the compiled run...
    assert "resumed from" in eager and "epoch 2/2" in eager
    compiled = wine(folder, 3, "--compile")  # ...and compiled resumes the eager one
    assert re.search(r"resumed from \S+epoch_000002\.pt", compiled) and "epoch 3/3" in compiled
