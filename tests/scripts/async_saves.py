"""A 2-worker job that checkpoints every 2 steps in the background (run with ddpkit run).

    async_saves.py CHECKPOINT_DIR OUT.pt

About 57 MB of state (4.7M parameters and Adam's moments), 3 epochs of 20 steps
(``ASYNC_SAVES_EPOCHS`` changes that); rank 0 writes the final parameters to OUT.pt.
``ASYNC_SAVES_STRATEGY=fsdp`` shards the model: every rank writes its shards in the background.
"""

from __future__ import annotations

import os
import sys

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
    epochs = int(os.environ.get("ASYNC_SAVES_EPOCHS", "3"))
    trainer.fit(ddpkit.prepare_loader(data, batch_size=32), epochs=epochs)
    state = {  # FSDP's shards are gathered: every rank takes part
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
        for k, v in ddpkit.unwrap_model(model).state_dict().items()
    }
    if ddpkit.is_main():
        torch.save(state, out)
    ddpkit.shutdown()


if __name__ == "__main__":
    main()
