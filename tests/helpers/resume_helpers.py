"""A small resumable training run in this process (a world of one), for the resume tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import ddpkit
from helpers.mp_workers import cpu_state, crash_before_step, toy_dataset


class Interrupted(Exception):
    """Stands in for a crash at a chosen optimizer step."""


def dropout_model() -> nn.Module:
    torch.manual_seed(0)  # dropout makes the result depend on the random state too
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))


def train(
    folder: Path | str,
    epochs: int = 3,
    crash_at: int | None = None,
    plain_loader: bool = False,
    model_fn: Callable[[], nn.Module] = dropout_model,
    **options: object,
) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    """Adam on the toy task (5 steps per epoch), saving every 2 steps; optionally crash."""
    ddpkit.shutdown()
    ddpkit.init(seed=3, hang_timeout=0)
    model = ddpkit.prepare_model(model_fn())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    options = {"save_every_steps": 2, **options}
    trainer = ddpkit.Trainer(model, opt, F.cross_entropy, folder, **options)  # type: ignore[arg-type]
    if crash_at is not None:
        crash_before_step(trainer, crash_at, Interrupted)
    data = toy_dataset()
    shuffled = torch.Generator().manual_seed(5)  # a fixed order per run, not per epoch
    loader = (DataLoader(data, batch_size=8, shuffle=True, generator=shuffled) if plain_loader
              else ddpkit.prepare_loader(data, batch_size=8))  # fmt: skip
    history = trainer.fit(loader, epochs=epochs)
    return cpu_state(model), history
