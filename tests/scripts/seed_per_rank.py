"""A classic mistake: seeding with the rank before building the model and the data.

DDP copies rank 0's weights to every rank, so the model looks fine; but each rank generated
a different synthetic dataset, so N workers do not train what one process trains.
"""

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import ddpkit


def seeded_per_rank_setup() -> tuple[nn.Module, torch.optim.Optimizer, object]:
    """Model, optimizer and loader, built after the mistake."""
    torch.manual_seed(1234 + int(os.environ.get("RANK", "0")))  # the mistake
    ddpkit.init()
    features = torch.randn(256, 8)
    labels = (features.sum(dim=1) > 0).long()
    model = ddpkit.prepare_model(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = ddpkit.prepare_loader(TensorDataset(features, labels), batch_size=16)
    return model, optimizer, loader


def main() -> None:
    model, optimizer, loader = seeded_per_rank_setup()
    ddpkit.Trainer(model, optimizer, F.cross_entropy).fit(loader, epochs=2)


if __name__ == "__main__":
    main()
