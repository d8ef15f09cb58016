"""A 2-worker job that checkpoints every 2 steps in the background (run with ddpkit run).

    async_saves.py CHECKPOINT_DIR OUT.pt

About 57 MB of state (4.7M parameters and Adam's moments), 3 epochs of 20 steps
(``ASYNC_SAVES_EPOCHS`` changes that); rank 0 writes the final parameters to OUT.pt.
``ASYNC_SAVES_STRATEGY=fsdp`` shards the model: every rank writes its shards in the background.

The run's first mid-epoch checkpoint is written to a slow disk: its sealed file (``trainer.pt``
of a sharded one) is written only once training took a step past it, and the script says
``async_saves: step S's checkpoint was still being written after T steps``. A write in the
background sees T > S; one that holds training up (a synchronous save) waits out the disk's
limit and sees T == S.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

import ddpkit


def main() -> None:
    folder, out = sys.argv[1], sys.argv[2]
    ddpkit.init(seed=0)
    torch.manual_seed(0)
    strategy = os.environ.get("ASYNC_SAVES_STRATEGY", "ddp")
    model = ddpkit.prepare_model(nn.Sequential(nn.Linear(256, 2048), nn.ReLU(),
                                               nn.Linear(2048, 2048), nn.ReLU(),
                                               nn.Linear(2048, 4)), strategy)  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(
        torch.randn(1280, 256, generator=generator),
        torch.randint(0, 4, (1280,), generator=generator),
    )
    trainer = ddpkit.Trainer(model, opt, F.cross_entropy, folder, save_every_steps=2,
                             async_save=True)  # fmt: skip
    hold_the_first_write(trainer, strategy)
    epochs = int(os.environ.get("ASYNC_SAVES_EPOCHS", "3"))
    trainer.fit(ddpkit.prepare_loader(data, batch_size=32), epochs=epochs)
    state = {  # FSDP's shards are gathered: every rank takes part
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
        for k, v in ddpkit.unwrap_model(model).state_dict().items()
    }
    if ddpkit.is_main():
        torch.save(state, out)
    ddpkit.shutdown()


# How long the slow disk holds a write at most. A background write is let go within a step
# (0.3-0.5 s measured on a 2-core machine, a few seconds when loaded); only a write that holds
# training up waits it out.
HELD_AT_MOST_S = 30.0


def hold_the_first_write(trainer: ddpkit.Trainer, strategy: str) -> None:
    """Make the storage seam (``save_sealed``, where every checkpoint's sealed file is written)
    a slow disk for the first mid-epoch checkpoint: done once training took the next step."""
    # FSDP: the sharded module seals the shards' digests with the training state, last.
    module = importlib.import_module(
        f"ddpkit.checkpoint.{'sharded' if strategy == 'fsdp' else 'storage'}"
    )
    real_save, held = module.save_sealed, []

    def slow_disk(state: dict[str, Any], path: Path) -> None:
        if not held and state.get("progress") is not None:  # another step follows it
            held.append(state["step"])
            deadline = time.monotonic() + HELD_AT_MOST_S
            while trainer.step <= state["step"] and time.monotonic() < deadline:
                time.sleep(0.005)
            print(f"async_saves: step {state['step']}'s checkpoint was still being written after "
                  f"{trainer.step} steps", flush=True)  # fmt: skip
        real_save(state, path)

    module.save_sealed = slow_disk


if __name__ == "__main__":
    main()
