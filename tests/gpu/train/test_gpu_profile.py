"""GPU tier: a profiled window on one GPU records CUDA kernels and sums them (skipped
without a CUDA GPU).

On a GPU the profiler adds CUDA activity; the rank's trace must hold the kernels (on the
device's tracks, moved onto the rank's process track in the merged timeline) and the top
operators count their self time.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import ddpkit
from helpers.gpus import needs_gpus

pytestmark = needs_gpus(1)


def test_a_window_on_a_gpu_holds_its_kernels(tmp_path: Path) -> None:
    ddpkit.init(hang_timeout=0)
    data = TensorDataset(torch.randn(256, 512), torch.randint(0, 10, (256,)))
    model = ddpkit.prepare_model(torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(),
                                                     torch.nn.Linear(2048, 10)))  # fmt: skip
    trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy,
                             log_dir=tmp_path, profile="3-5")  # fmt: skip
    trainer.fit(DataLoader(data, batch_size=32), epochs=1)
    folder = tmp_path / "profile" / "steps-3-5"
    merged = json.loads((folder / "merged.json").read_text())
    kernels = [e for e in merged["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels and {e["pid"] for e in kernels} == {0}  # on rank 0's track
    summary = (folder / "summary.txt").read_text()
    assert "profile of steps 3-5" in summary
