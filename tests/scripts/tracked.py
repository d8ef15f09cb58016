"""A job that logs to MLflow and W&B, slow enough (0.1 s a step) to be killed mid-run:
``ddpkit run --nproc 2 tracked.py CHECKPOINT_DIR WANDB_DIR`` with MLFLOW_TRACKING_URI set.
4 epochs of 5 steps, a checkpoint every 3 steps; points are sent at once (flush_every=0),
so a killed job leaves points after its last checkpoint in the trackers; the CSV in
CHECKPOINT_DIR/../logs is what a tracker that lost points is filled in from."""

import sys
import time
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

import ddpkit


class Slow(ddpkit.Callback):
    def on_train_batch_end(self, trainer, batch, metrics):
        time.sleep(0.1)


checkpoints, wandb_dir = sys.argv[1], sys.argv[2]
ddpkit.init(seed=0)
generator = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(80, 6, generator=generator), torch.randint(0, 3, (80,)))
model = ddpkit.prepare_model(torch.nn.Linear(6, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
params = {"lr": 0.05, "model": "linear"}
loggers = [
    ddpkit.MLflowLogger(experiment="tracked", params=params, flush_every=0),
    ddpkit.WandbLogger(project="tracked", mode="offline", dir=wandb_dir, params=params,
                       flush_every=0),
]  # fmt: skip
trainer = ddpkit.Trainer(
    model, optimizer, torch.nn.functional.cross_entropy, checkpoint_dir=checkpoints,
    save_every_steps=3, log_dir=Path(checkpoints).parent / "logs", loggers=loggers,
    callbacks=[Slow()],
)  # fmt: skip
trainer.fit(ddpkit.prepare_loader(data, batch_size=8), epochs=4)
