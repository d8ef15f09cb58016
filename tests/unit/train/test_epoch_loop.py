"""The epoch loop's contract with the loader, in a world of one."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, SequentialSampler, TensorDataset

import ddpkit


class EpochCountingSampler(SequentialSampler):  # type: ignore[type-arg]
    """A sampler that notes every ``set_epoch`` call it gets."""

    def __init__(self, data: TensorDataset) -> None:
        super().__init__(data)
        self.told: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.told.append(epoch)


def test_the_sampler_is_told_each_epoch_once() -> None:
    ddpkit.init(hang_timeout=0)
    data = TensorDataset(torch.randn(8, 3), torch.randint(0, 2, (8,)))
    sampler = EpochCountingSampler(data)
    model = ddpkit.prepare_model(torch.nn.Linear(3, 2))
    trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy)
    trainer.fit(DataLoader(data, batch_size=4, sampler=sampler), epochs=2)
    assert sampler.told == [0, 1]  # before: [0, 0, 1, 1]
