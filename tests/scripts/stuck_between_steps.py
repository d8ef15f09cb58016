"""Trains, checkpointing every step, until rank 1's loop body gets stuck after step 3 (rank 0
then waits in the next gradient all-reduce): ``ddpkit run --nproc 2 stuck_between_steps.py
FOLDER``. Rank 1 writes FOLDER/stuck when it is. A stop signal now can reach no step boundary."""

import sys
import time
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

import ddpkit

folder = Path(sys.argv[1])
world = ddpkit.init(timeout=120, hang_timeout=0)
data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
model = ddpkit.prepare_model(torch.nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loop = ddpkit.TrainLoop({"model": model, "optimizer": optimizer}, folder / "ckpt",
                        save_every_steps=1)  # fmt: skip
for _epoch in loop.epochs(1):
    for x, y in loop.batches(ddpkit.prepare_loader(data, batch_size=4)):
        if loop.step == 3 and world.rank == 1:
            (folder / "stuck").write_text("")
            time.sleep(3600)  # a body that never returns: a stuck read, a slow host...
        loop.backward(torch.nn.functional.cross_entropy(model(x), y))
        loop.optimizer_step()
