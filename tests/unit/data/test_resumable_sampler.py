"""prepare_loader's sampler: torch's DistributedSampler from the start, and an epoch that goes
on at a global position over any number of ranks."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset

from ddpkit.data.loader import ResumableDistributedSampler


@pytest.mark.parametrize("size,world", [(1, 1), (7, 2), (13, 3), (96, 8), (5, 8)])
@pytest.mark.parametrize("shuffle,drop_last", [(False, False), (True, False), (True, True)])
def test_it_is_distributed_sampler_sample_for_sample_and_resumes_at_the_same_size(
    size: int, world: int, shuffle: bool, drop_last: bool
) -> None:
    if drop_last and size < world:
        pytest.skip("drop_last leaves no sample")
    data = TensorDataset(torch.arange(size))
    options = {"num_replicas": world, "shuffle": shuffle, "seed": 5, "drop_last": drop_last}
    for epoch, rank in itertools.product((0, 3), range(world)):
        torch_sampler = DistributedSampler(data, rank=rank, **options)
        ours = ResumableDistributedSampler(data, rank=rank, **options)
        torch_sampler.set_epoch(epoch)
        ours.set_epoch(epoch)
        expected = list(torch_sampler)
        assert list(ours) == expected and len(ours) == len(torch_sampler)
        for done in range(len(expected) + 1):  # every rank did `done` of its samples
            ours.start_at(done * world)
            assert list(ours) == expected[done:] and ours.remaining() == len(expected) - done


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("after", [1, 2, 3, 5])
def test_an_epoch_goes_on_over_another_world_with_each_remaining_sample_once(
    shuffle: bool, after: int
) -> None:
    data, size = TensorDataset(torch.arange(30)), 30
    generator = torch.Generator().manual_seed(5 + 2)
    order = torch.randperm(size, generator=generator).tolist() if shuffle else list(range(size))
    for position in range(size + 1):
        samplers = []
        for rank in range(after):
            sampler = ResumableDistributedSampler(data, after, rank, shuffle=shuffle, seed=5)
            sampler.set_epoch(2)
            sampler.start_at(position)
            samplers.append(sampler)
        dealt = [i for sampler in samplers for i in sampler]
        left = order[position:]
        assert set(left) <= set(dealt) and len(dealt) - len(left) == -len(left) % after
        assert len({len(list(s)) for s in samplers}) == 1  # every rank as many (padding)
