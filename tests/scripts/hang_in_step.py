"""Rank 1 stops inside its third training step (in the loss function); rank 0 goes on."""

import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import ddpkit

calls = 0


def loss_that_stalls_on_rank_1(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    global calls
    calls += 1
    if calls == 3 and ddpkit.get_rank() == 1:
        time.sleep(3600)  # a rank stuck mid-step: a dead file system, a deadlock
    return F.cross_entropy(outputs, targets)


def main() -> None:
    ddpkit.init(seed=0)
    samples = 32 * ddpkit.current_world().world_size  # 4 steps an epoch at any size
    data = TensorDataset(torch.randn(samples, 4), torch.randint(0, 2, (samples,)))
    model = ddpkit.prepare_model(nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = ddpkit.Trainer(model, optimizer, loss_that_stalls_on_rank_1)
    trainer.fit(ddpkit.prepare_loader(data, batch_size=8), epochs=1)


if __name__ == "__main__":
    main()
