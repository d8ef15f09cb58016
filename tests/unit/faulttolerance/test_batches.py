"""ReplicaBatches' dealing, replayed without torchft: three groups in lockstep, whose quorum
each step is scripted (a group dies, a step fails, a group heals and rejoins). Every batch
is trained on once per epoch, by whichever groups were there."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import pytest
import torch
from torch.utils.data import TensorDataset

import ddpkit
from ddpkit.env.world import World
from ddpkit.errors import ConfigError
from ddpkit.faulttolerance.batches import ReplicaBatches
from ddpkit.faulttolerance.buckets import Buckets
from ddpkit.faulttolerance.groups import ReplicaGroups
from ddpkit.faulttolerance.manager import GroupManager
from ddpkit.faulttolerance.members import Members

BATCHES = 10  # 40 samples in batches of 4


class Job:
    """The script every group's fake manager reads: this step's members, and its fate."""

    def __init__(self) -> None:
        self.members: list[int] = []
        self.fails = False
        self.healing: dict[int, int] = {}  # healer -> the peer it heals from
        self.states: dict[int, dict[str, Any]] = {}


class FakeManager:
    """What GroupManager asks of torchft's Manager, answered from the job's script."""

    def __init__(self, job: Job, group: int) -> None:
        self.job, self.group = job, group
        self.fns: dict[str, Any] = {}
        self.received: dict[str, Any] | None = None

    def register_state_dict_fn(self, key: str, load: Any, save: Any) -> None:
        self.fns[key] = (load, save)
        self.job.states.setdefault(self.group, {})[key] = save

    def start_quorum(self) -> None:
        peer = self.job.healing.get(self.group)
        if peer is not None:  # torchft fetches the peer's state at the quorum, before its step
            self.received = self.job.states[peer]["ddpkit_batches"]()

    def participating_rank(self) -> int | None:
        members = [g for g in self.job.members if g not in self.job.healing]
        return members.index(self.group) if self.group in members else None

    def num_participants(self) -> int:
        return len([g for g in self.job.members if g not in self.job.healing])

    def allreduce(self, tensor: torch.Tensor) -> Any:
        return type("Done", (), {"wait": lambda self: True})()

    def should_commit(self) -> bool:
        if self.received is not None:  # torchft loads it here, then commits with the peers
            self.fns["ddpkit_batches"][0](self.received)
            self.received = None
        return not self.job.fails

    def current_step(self) -> int:
        return 0


def world(rank: int = 0, size: int = 1) -> World:
    return World(rank=rank, local_rank=rank, world_size=size, backend="gloo",
                 device=torch.device("cpu"))  # fmt: skip


def group(job: Job, index: int) -> tuple[ReplicaBatches, torch.nn.Module, ReplicaGroups]:
    model = torch.nn.Linear(2, 1)
    manager = object.__new__(GroupManager)  # its torchft parts replaced by the fake
    manager.manager, manager.group, manager._open = FakeManager(job, index), str(index), False
    manager._last_step, manager._dealer = 0, None
    manager.members = Members(index, torch.device("cpu"))
    manager.buckets = Buckets(cap_bytes=2**20)
    manager.rank, manager.size, manager._started, manager.votes = 0, 1, True, 0
    manager._run = None
    manager.timeout, manager.retries, manager.lighthouse = 1.0, 0, "http://h:1"
    manager.transport = type("Transport", (), {"last_heal": None})()
    groups = ReplicaGroups(group=str(index), lighthouse="http://h:1")
    groups._manager = manager  # as the loop's start would have made it
    data = TensorDataset(torch.arange(40.0).unsqueeze(1), torch.zeros(40))
    with patch("ddpkit.faulttolerance.batches.current_world", world):
        return ReplicaBatches(groups, data, batch_size=4, shuffle=False), model, groups


def step(job: Job, groups: dict[int, Any], iterators: dict[int, Any]) -> dict[int, Any]:
    """One step of every member: its batch, the gradient of its weighed loss (a gradient of
    ones, times the weight), the vote."""
    batches = {}
    for g in job.members:
        batches[g] = next(iterators[g], None)
    for g in job.members:
        _, model, replica = groups[g]
        weight = replica.loss_weight()  # as the loop asks, before backward and after
        model.weight.grad = torch.ones_like(model.weight) * weight
        model.bias.grad = torch.ones_like(model.bias) * weight
        replica.finish(model)
    return batches


def test_each_batch_once_per_epoch_through_a_death_a_failed_step_and_a_rejoin() -> None:
    job = Job()
    groups = {g: group(job, g) for g in range(3)}
    iterators = {g: iter(groups[g][0]) for g in range(3)}
    trained: list[float] = []  # the first sample of each batch a committed step trained

    def run(members: list[int], fails: bool = False, healing: dict[int, int] | None = None):
        job.members, job.fails, job.healing = members, fails, healing or {}
        batches = step(job, groups, iterators)
        if not fails:
            for g, batch in batches.items():
                dealer = groups[g][0]
                if batch is not None and g not in job.healing and not dealer.idle:
                    trained.append(float(batch[0][0, 0]))

    run([0, 1, 2])  # batches 0, 1, 2
    run([0, 1, 2], fails=True)  # group 2 dies in the exchange: 3, 4, 5 dealt again
    run([0, 1])  # 3, 4
    run([0, 1])  # 5, 6
    iterators[2] = iter(groups[2][0])  # group 2 started again: it heals from group 0
    run([0, 1, 2], healing={2: 0})  # 7, 8 (group 2 receives the ledger, trains nothing)
    run([0, 1, 2])  # 9, and two groups with no batch left (fillers, zero gradients)
    assert sorted(trained) == [4.0 * b for b in range(BATCHES)]
    assert [dealer.cursor for dealer, _, _ in groups.values()] == [12, 12, 12]
    # The next call ends the epoch on every group at once; the next epoch starts at 0.
    for g in range(3):
        assert next(iterators[g], None) is None
    assert [dealer.epoch for dealer, _, _ in groups.values()] == [1, 1, 1]
    assert groups[0][0].record[-1] == (0, [9])


def test_the_short_last_step_averages_over_the_slices_trained_not_every_group() -> None:
    job = Job()
    groups = {g: group(job, g) for g in range(3)}
    iterators = {g: iter(groups[g][0]) for g in range(3)}
    job.members = [0, 1, 2]
    for _ in range(3):  # slices 0-8
        step(job, groups, iterators)
    step(job, groups, iterators)  # slice 9 alone: group 0's, the others fillers
    grads = [float(groups[g][1].weight.grad[0, 0]) for g in range(3)]
    # torchft divides the sum by 3 participants: 3 * 1 / 3 is slice 9's gradient alone
    assert grads == [3.0, 0.0, 0.0]


class Groups:
    """A group's place as ReplicaBatches reads it: its rank in the group, the group's size
    (the world), and the group's position in the quorum (its manager)."""

    def __init__(self, rank: int, size: int, position: int) -> None:
        self.rank, self.size, self._position, self.votes = rank, size, position, 0
        self.manager = self

    def deal_with(self, dealer: Any) -> None: ...

    def start(self) -> None: ...

    def position(self) -> int:
        return self._position


def first_batch(groups: Groups) -> list[int]:
    data = TensorDataset(torch.arange(40.0).unsqueeze(1))
    in_group = world(groups.rank, groups.size)
    with patch("ddpkit.faulttolerance.batches.current_world", lambda: in_group):
        batches = ReplicaBatches(groups, data, batch_size=4, shuffle=False)
    next(iter(batches))
    return batches.dealt


def test_the_ranks_of_two_groups_of_two_take_four_slices_side_by_side() -> None:
    dealt = [first_batch(Groups(rank, 2, position)) for position in (0, 1) for rank in (0, 1)]
    assert dealt == [list(range(4 * s, 4 * s + 4)) for s in range(4)]


def test_verifys_reference_reads_what_every_rank_of_every_group_reads(monkeypatch) -> None:
    monkeypatch.setenv("DDPKIT_VERIFY_AS_WORLD", "4")  # one process standing in for 2 x 2
    ddpkit.init()
    try:
        assert first_batch(Groups(0, 1, 0)) == list(range(16))
    finally:
        ddpkit.shutdown()


def test_a_second_batch_before_the_steps_vote_is_refused_accumulation_would_repeat_it() -> None:
    batches, _, _ = group(Job(), 0)
    batches.groups.manager.manager.job.members = [0]
    iterator = iter(batches)
    next(iterator)
    with pytest.raises(ConfigError, match="accumulate=1"):
        next(iterator)
