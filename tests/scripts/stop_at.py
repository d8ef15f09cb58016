"""Waits at one point of a job's life so a test can send SIGTERM there:
``ddpkit run --nproc 2 stop_at.py FOLDER POINT``, POINT one of before_init, after_init,
after_fit. Rank 0 writes FOLDER/POINT when it gets there."""

import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

folder, point = Path(sys.argv[1]), sys.argv[2]


def arrive(here: str, rank: int) -> None:
    if here == point:
        if rank == 0:
            (folder / here).write_text("")
        time.sleep(3600)


arrive("before_init", int(os.environ["RANK"]))  # e.g. a slow import

import ddpkit  # noqa: E402

world = ddpkit.init(timeout=60)
arrive("after_init", world.rank)  # e.g. reading the data
data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
model = ddpkit.prepare_model(torch.nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss = torch.nn.functional.cross_entropy
trainer = ddpkit.Trainer(model, optimizer, loss, checkpoint_dir=str(folder / "ckpt"))
trainer.fit(ddpkit.prepare_loader(data, batch_size=4), epochs=1)
arrive("after_fit", world.rank)  # e.g. evaluating
