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


class Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Six samples and no ``__len__``: its DataLoader's ``len()`` raises TypeError."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        for i in range(6):
            yield torch.full((3,), float(i)), torch.tensor(i % 2)


def test_a_dataloader_over_a_stream_without_a_length_trains() -> None:
    ddpkit.init(hang_timeout=0)
    model = ddpkit.prepare_model(torch.nn.Linear(3, 2))
    trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy)
    history = trainer.fit(DataLoader(Stream(), batch_size=2), epochs=2)
    assert trainer.step == 6 and len(history) == 2
