"""Per-sample randomness: keyed by (seed, epoch, sample), the same at every world size."""

from __future__ import annotations

import gc
import pickle

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

import ddpkit
from ddpkit.data.loader import GlobalOrderSampler, ResumableDistributedSampler
from ddpkit.data.samples import SampleIndex, sample_generator, sample_indices, sample_seed
from ddpkit.errors import ConfigError


class Jittered(Dataset[tuple[int, torch.Tensor]]):
    """Each sample with its own noise, drawn from the sample's generator."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor]:
        noise = torch.randn(3, generator=ddpkit.sample_generator(index))  # type: ignore[arg-type]
        return int(index), noise


def noise_by_sample(world: int, epoch: int, workers: int = 0) -> dict[int, torch.Tensor]:
    found = {}
    for rank in range(world):
        sampler = ResumableDistributedSampler(Jittered(), world, rank, shuffle=True, seed=4)
        sampler.set_epoch(epoch)
        loader = DataLoader(Jittered(), batch_size=2, sampler=sampler, num_workers=workers)
        for ids, noise in loader:
            found.update(zip(ids.tolist(), noise, strict=True))
    return found


def test_a_samples_noise_is_the_same_at_any_world_size_and_in_loader_workers() -> None:
    alone = noise_by_sample(1, epoch=3)
    for world, workers in ((2, 0), (3, 2)):
        other = noise_by_sample(world, epoch=3, workers=workers)
        assert all(torch.equal(alone[i], other[i]) for i in range(12)), world
    later = noise_by_sample(1, epoch=4)
    assert not any(torch.equal(alone[i], later[i]) for i in range(12))  # new noise each epoch
    assert not torch.equal(alone[0], alone[1])  # and per sample


def test_the_verify_reference_and_a_resumed_epoch_carry_the_same_indices() -> None:
    reference = list(GlobalOrderSampler(Jittered(), num_replicas=2, shuffle=True, seed=4))
    assert all(isinstance(i, SampleIndex) and i.seed == 4 for i in reference)
    resumed = ResumableDistributedSampler(Jittered(), 3, 1, shuffle=True, seed=4)
    resumed.start_at(5)
    index = next(iter(resumed))
    assert pickle.loads(pickle.dumps(index)).epoch == 0 and torch.zeros(12)[index] == 0


def test_a_plain_index_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="needs the index prepare_loader's sampler gives"):
        sample_generator(3)  # type: ignore[arg-type]


def test_an_epochs_indices_carry_its_epoch_and_seed_through_a_pickle() -> None:
    dealt = list(sample_indices([5, 1], epoch=3, seed=7))
    assert dealt == [5, 1] and all(isinstance(i, SampleIndex) for i in dealt)
    back = pickle.loads(pickle.dumps(dealt))  # to DataLoader workers and back
    assert [(int(i), i.epoch, i.seed) for i in back] == [(5, 3, 7), (1, 3, 7)]
    other = next(sample_indices([5], epoch=4, seed=7))
    assert other == dealt[0] and sample_seed(other) != sample_seed(dealt[0])
    assert SampleIndex(5, 3, 7).epoch == 3 and type(SampleIndex(5, 3, 7)) is type(dealt[0])


def test_an_epochs_indices_are_made_as_they_are_read_not_kept_all_at_once() -> None:
    # Each is an object the cyclic collector tracks: a list of an epoch's set off its passes.
    ddpkit.init()
    sampler = ddpkit.prepare_loader(TensorDataset(torch.zeros(20_000)), batch_size=8).sampler
    reading = iter(sampler)
    first = next(reading)
    alive = sum(isinstance(o, SampleIndex) for o in gc.get_objects())
    ddpkit.shutdown()
    assert isinstance(first, SampleIndex) and alive < 100, alive
