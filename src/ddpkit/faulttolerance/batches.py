"""**Experimental.** The batches of a fault-tolerant job dealt among the replica groups alive
at each step, so that each sample is trained on once per epoch whichever groups come and go.

An epoch is cut into slices of ``batch_size`` samples, one rank's batch. One cursor, the
same on every group (a group that heals receives it with the run), counts the slices
already trained on. At each step every group asks for the quorum first; rank ``r`` of the
group at position ``p`` of ``k`` takes slice ``cursor + p * W + r`` (``W`` ranks a group), and
once the step is committed everywhere the cursor moves on by ``k * W``. A step that is not
committed (a group died during the exchange) moves nothing: its slices are dealt again at
the next step, to the groups still there. A rank that finds no slice left (the epoch's last
step) computes on a filler whose loss is weighed 0, and the others' are weighed so that the
step averages over the samples trained, not over every rank
(:meth:`ReplicaBatches.loss_weight`); a group that is healing takes part with zero gradients,
as torchft has it. Every group ends the
epoch at the same step, when the cursor has passed the last slice.

In ``ddpkit verify``'s single-process reference, standing in for ``R`` ranks, the one
process takes ``R`` slices a step, the samples the ranks of every group read together.

The order of the samples is a permutation per epoch from ``seed`` (``shuffle=False``: in
order), the same on every group.

Example::

    batches = groups.batches(dataset, batch_size=32)   # groups: ddpkit.ReplicaGroups
    for epoch in loop.epochs(10):
        for x, y in loop.batches(batches):
            ...
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.utils.data import default_collate

from ddpkit.errors import ConfigError
from ddpkit.runtime.session import current_world, reference_dealing, reference_world_size

if TYPE_CHECKING:
    from ddpkit.faulttolerance.manager import Dealer, GroupManager


class Groups(Protocol):
    """What the batches ask of the replica groups (:class:`~ddpkit.ReplicaGroups`)."""

    @property
    def manager(self) -> GroupManager: ...

    def deal_with(self, dealer: Dealer) -> None: ...


class ReplicaBatches:
    """An epoch's batches of ``dataset``, each trained on once by whichever groups are alive.

    ``record`` holds, for each committed step, the epoch and the slices every group in the
    quorum trained on (what this group saw of the whole job); ``dealt``, the dataset indices
    of this rank's latest batch.

    Example::

        for x, y in loop.batches(ReplicaBatches(groups, data, batch_size=8, seed=0)): ...
    """

    ranks_in_step = True  # one cursor for all: every rank ends the epoch at the same step

    def __init__(
        self, groups: Groups, dataset: Any, batch_size: int, *, shuffle: bool = True,
        seed: int = 0,
    ) -> None:  # fmt: skip
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.groups = groups
        world = current_world()  # this group's ranks
        self.rank, self.size = world.rank, world.world_size
        self.slice_size = batch_size
        self.slices = -(-len(dataset) // batch_size)
        # A group's slices a step: one a rank, or all the ranks' verify's reference stands for
        self.span = reference_world_size() or self.size
        self.per_rank = self.span // self.size
        # verify's reference for a run with a failure: each step's slices, as the groups had
        self.dealing = reference_dealing() if reference_world_size() else []
        self.batch_size = batch_size * self.per_rank  # one rank's batch, as loaders say
        self.epoch, self.cursor = 0, 0
        self.record: list[tuple[int, list[int]]] = []
        self.dealt: list[int] = []
        self._mine: list[int] = []  # this rank's slices at this step; none: a filler
        self._ordered: tuple[int, torch.Tensor] = (-1, torch.empty(0))
        self._voted_at = -1  # the groups' vote count when the latest batch was dealt
        self.groups.deal_with(self)

    def set_epoch(self, epoch: int) -> None:
        """The loop says which epoch starts (after a resume from a checkpoint, a later one)."""
        if epoch != self.epoch:
            self.epoch, self.cursor = epoch, 0

    def start_at_batch(self, count: int) -> None:
        """A resume part-way through an epoch: possible only where the cursor came back with
        the run (TrainLoop's state holds this object), as the groups' share varied."""
        if count and not self.cursor:
            raise ConfigError(
                f"a fault-tolerant run resumes part-way through epoch {self.epoch + 1} "
                f"({count} steps done), but ReplicaBatches' place in it was not saved: put "
                "it in TrainLoop's state (TrainLoop({..., 'batches': batches})), or save "
                "checkpoints at epoch ends only (save_every, not save_every_steps)"
            )

    @property
    def idle(self) -> bool:
        """Whether this rank has no slice of its own at this step (its loss is weighed 0)."""
        return not self._mine

    def __iter__(self) -> Iterator[Any]:
        manager = self.groups.manager
        while True:
            manager.start()  # this step's quorum: who is in it, and where
            if self.cursor >= self.slices:  # the same cursor everywhere: all end here
                self.epoch, self.cursor = self.epoch + 1, 0
                return
            if self._voted_at == manager.votes:
                raise ConfigError(
                    "ReplicaBatches deals one batch a step, and a second came before the "
                    "step's vote: train with accumulate=1 (each micro-batch would get the "
                    "same batch)"
                )
            self._voted_at = manager.votes
            self._mine = self._slices_at(manager.position())
            yield self._batch(self._mine or [self.cursor])

    def loss_weight(self, participants: int) -> float:
        """What this rank's loss (a mean over its batch) is multiplied by before backward,
        so that once DDP and the exchange have averaged the gradients over every rank of the
        quorum, the step's gradient is the mean over the samples it trained: 0 without a
        slice; 1 unless the epoch's end leaves ranks without a slice or a short one."""
        if not self._mine:
            return 0.0
        end = min(self.cursor + participants * self._span_now(), self.slices)
        step_samples = sum(len(self._indices(s)) for s in range(self.cursor, end))
        return participants * self.size * len(self.dealt) / step_samples

    def committed(self, participants: int) -> None:
        """After a step every group committed: its slices are done; the cursor moves on."""
        step = participants * self._span_now()
        self.record.append((self.epoch, list(range(self.cursor, min(self.cursor + step,
                                                                    self.slices)))))  # fmt: skip
        self.cursor += step

    def epoch_plan(self) -> tuple[list[int], str]:
        """The epoch's samples in the order they are dealt, and how, for ``ddpkit verify``'s
        coverage check.

        Example::

            indices, how = batches.epoch_plan()
        """
        how = (f"{self.slices} batches of {self.slice_size}, each dealt once per epoch among "
               "the replica groups alive at each step (ReplicaBatches)")  # fmt: skip
        return self._order().tolist(), how

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])

    def _slices_at(self, position: int | None) -> list[int]:
        if position is None:  # healing: it only receives this step
            return []
        span = self._span_now()
        per_rank = span // self.size
        first = self.cursor + position * span + self.rank * per_rank
        return [s for s in range(first, first + per_rank) if s < self.slices]

    def _span_now(self) -> int:
        """A group's slices at this step: one a rank, or in verify's reference the slices the
        groups trained at this step (fewer where a group was missing or healing)."""
        steps = len(self.record)
        return self.dealing[steps] if steps < len(self.dealing) else self.span

    def _batch(self, slices: list[int]) -> Any:
        self.dealt = [index for s in slices for index in self._indices(s)]
        return default_collate([self.dataset[i] for i in self.dealt])

    def _indices(self, slice_: int) -> list[int]:
        order = self._order()
        return order[slice_ * self.slice_size : (slice_ + 1) * self.slice_size].tolist()

    def _order(self) -> torch.Tensor:
        """The epoch's order (drawn once an epoch)."""
        if self._ordered[0] != self.epoch:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=generator) if self.shuffle else (
                torch.arange(len(self.dataset)))  # fmt: skip
            self._ordered = (self.epoch, order)
        return self._ordered[1]
