"""**Experimental.** The batches of a fault-tolerant job dealt among the replica groups alive
at each step, so that each sample is trained on once per epoch whichever groups come and go.

One cursor, the same on every group (a group that heals receives it with the run), counts
the epoch's batches already trained on. At each step every group asks for the quorum first;
the group at position ``p`` of ``k`` in it takes batch ``cursor + p``, and once the step is
committed everywhere the cursor moves on by ``k``. A step that is not committed (a group
died during the exchange) moves nothing: its batches are dealt again at the next step, to
the groups still there. A group that finds no batch left (the epoch's last step, fewer
batches than groups) computes on a filler whose gradient is zeroed before the exchange, and
a group that is healing takes part with zero gradients, as torchft has it. Every group ends
the epoch at the same step, when the cursor has passed the last batch.

The order of the samples is a permutation per epoch from ``seed`` (``shuffle=False``: in
order), the same on every group.

Example::

    batches = ReplicaBatches(model, dataset, batch_size=32)   # model: FaultTolerantStrategy's
    for epoch in loop.epochs(10):
        for x, y in loop.batches(batches):
            ...
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import default_collate

from ddpkit.parallel.faulttolerant import replica_groups


class ReplicaBatches:
    """An epoch's batches of ``dataset``, each trained on once by whichever groups are alive.

    ``record`` holds, for each committed step, the epoch and the batches every group in the
    quorum trained on (what this group saw of the whole job).

    Example::

        for x, y in loop.batches(ReplicaBatches(model, data, batch_size=8, seed=0)): ...
    """

    def __init__(
        self, model: nn.Module, dataset: Any, batch_size: int, *, shuffle: bool = True,
        seed: int = 0,
    ) -> None:  # fmt: skip
        self.dataset, self.batch_size, self.shuffle, self.seed = dataset, batch_size, shuffle, seed
        self.batches = -(-len(dataset) // batch_size)
        self.epoch, self.cursor = 0, 0
        self.record: list[tuple[int, list[int]]] = []
        self._mine: int | None = None  # this step's batch, None: a filler (no batch left)
        self.groups = replica_groups(model)
        self.groups.deal_with(self)

    @property
    def idle(self) -> bool:
        """Whether this group has no batch of its own at this step (its gradient is zeroed)."""
        return self._mine is None

    def __iter__(self) -> Iterator[Any]:
        while True:
            self.groups.start()  # this step's quorum: who is in it, and where
            if self.cursor >= self.batches:  # the same cursor everywhere: all end here
                self.epoch, self.cursor = self.epoch + 1, 0
                return
            position = self.groups.position()
            index = None if position is None else self.cursor + position
            self._mine = index if index is not None and index < self.batches else None
            yield self._batch(self._mine if self._mine is not None else self.cursor)

    def committed(self, participants: int) -> None:
        """After a step every group committed: its batches are done; the cursor moves on."""
        done = list(range(self.cursor, min(self.cursor + participants, self.batches)))
        self.record.append((self.epoch, done))
        self.cursor += participants

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])

    def _batch(self, index: int) -> Any:
        order = self._order()
        chosen = order[index * self.batch_size : (index + 1) * self.batch_size]
        return default_collate([self.dataset[i] for i in chosen.tolist()])

    def _order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(len(self.dataset))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.dataset), generator=generator)
