"""Every step's state kept in the node's memory, and a restarted worker's resume from it.

Under ``ddpkit run`` with restarts (``--max-restarts``), after each optimizer step (and at
each epoch's end) every rank copies what a resume needs into the job's folder in
``/dev/shm`` (:mod:`ddpkit.checkpoint.memory`): the run's state (model, optimizers,
schedulers, grad scaler; DDP's identical replicas shared out between the node's ranks, a
sharded model's shards each kept by its own rank), its random generators, the loader's
generator and its place in the epoch with its own metric sums. When torch's agent restarts
the workers, they agree (one all-gather) on the newest snapshot every rank holds whole and
go on from it: nothing is read from storage, and the run ends as an uninterrupted one does.
Without a whole common snapshot they resume from the checkpoint folder, as before. Durable
checkpoints keep their own schedule.

A sharded model (FSDP, HSDP) is kept as each rank's own shards, plain tensors
(:mod:`ddpkit.parallel.shards`), and made DTensors again with the restarted run's mesh.

Example::

    snapshots = MemorySnapshots.from_environment(run.strategy.sharded)  # None: off
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any, Protocol

import torch

from ddpkit._core.log import EVERY_RANK, logger
from ddpkit._core.privatefolder import check_private
from ddpkit._core.protocol import MEMORY_SNAPSHOTS_ENV
from ddpkit._core.text import ranks_text
from ddpkit.checkpoint.memory import SnapshotRing, newest_common, read_snapshot
from ddpkit.checkpoint.neighbour import (
    NeighbourCopies,
    copies_group,
    fetch_from_neighbours,
    partners,
)
from ddpkit.checkpoint.rngstate import capture_rng, gather_from_ranks
from ddpkit.env.world import World
from ddpkit.errors import CheckpointError
from ddpkit.parallel.shards import local_state, resharded
from ddpkit.runtime.collectives import all_reduce_max, barrier
from ddpkit.runtime.session import current_world
from ddpkit.train.progress import EpochProgress

_fits = itertools.count(1)  # a script may train several times: each run keeps its own


class Restorable(Protocol):
    """What a memory snapshot restores: the loop, as :meth:`TrainLoop.load_state_dict`.

    Example::

        resume_from_memory(loop.snapshots, loop)   # a TrainLoop is one
    """

    @property
    def step(self) -> int:
        """Optimizer steps taken."""

    @property
    def run(self) -> Any:
        """The run's state (:class:`~ddpkit.train.state.RunState`): a sharded model's
        layout to restore into."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the run's state."""


class MemorySnapshots:
    """This rank's snapshots of one training run, in the job's memory folder ``folder``.

    Example::

        snapshots = MemorySnapshots(Path("/dev/shm/ddpkit-launch-x"), fit=1)
    """

    @classmethod
    def from_environment(cls, sharded: bool) -> MemorySnapshots | None:
        """The run's snapshots when the launcher gave a memory folder (None: off);
        ``sharded``: the model's state differs per rank (FSDP, HSDP)."""
        folder = os.environ.get(MEMORY_SNAPSHOTS_ENV)
        if not folder:
            return None
        check_private(Path(folder))  # nothing read back from a folder others could write
        return cls(Path(folder), next(_fits), sharded)

    def __init__(self, folder: Path, fit: int, sharded: bool = False) -> None:
        world = current_world()
        self.world, self.sharded = world, sharded
        first = world.rank - world.local_rank  # the node's ranks are consecutive
        name = f"fit{fit}.rank"
        # DDP's replicas are identical: the node's ranks share the copying out, each every
        # N-th tensor. A sharded model's shards are each rank's own: kept whole by it.
        writers, share = (1, 0) if sharded else (world.local_world_size, world.local_rank)
        self.ring = SnapshotRing(folder, f"{name}{world.rank}", writers, share)
        others = [] if sharded else [first + i for i in range(world.local_world_size)]
        self.node = [SnapshotRing(folder, f"{name}{rank}") for rank in others
                     if rank != world.rank]  # fmt: skip
        # the copies of the previous node's same local rank (with 2 nodes or more)
        self.kept = SnapshotRing(folder, f"fit{fit}.kept{partners(world)[1]}")
        self.group: Any = None  # the copies' gloo group, where every rank keeps snapshots
        self.copies: NeighbourCopies | None = None
        self._order = 0

    def take(
        self,
        run_state: dict[str, Any],
        progress: EpochProgress | None,
        generator: torch.Tensor | None,
    ) -> None:
        """Keep ``run_state`` (the loop's ``state_dict``, without the hooks' entries) as it
        stands after a step, ``progress`` into the epoch (None: at its end; ``generator``:
        the loader's for the next epoch). No collective: each rank copies its part."""
        epoch, step = int(run_state["epoch"]), int(run_state["step"])
        phase = "step" if progress is not None else "end"
        if self.sharded:  # plain tensors: this rank's shards, views of its memory
            run_state = local_state(run_state)
        own = {
            "rng": capture_rng(),
            "loader_generator": progress.generator_state if progress is not None else generator,
            "progress": progress.local_state() if progress is not None else None,
            "world_size": self.world.world_size,
        }
        self.ring.write(f"{step}:{epoch}:{phase}", self._order, run_state, own)
        self._order += 1
        if self.copies is not None:
            self.copies.offer()  # to the next node, in the background

    def start_copies(self) -> None:
        """From now on each snapshot also goes to the next node (with 2 nodes or more)."""
        if self.group is not None and self.copies is None:
            self.copies = NeighbourCopies(self.ring, self.kept, self.group, self.world)

    def forget(self) -> None:
        """Drop this rank's snapshots and the copies it keeps of another node's: the run
        goes on from elsewhere (a checkpoint, or a first start), and what they hold is of a
        past it left. Kept, they would outlive a world-size change: a later restart at the
        old size could find them whole and common, older than the run's newest checkpoint."""
        self.ring.forget()
        self.kept.forget()

    def close(self) -> None:
        """The copies finished and ended (every rank, at the run's end)."""
        if self.copies is not None:
            self.copies.close()
            self.copies = None

    def restore(
        self, loop: Restorable, key: str, whole: list[dict[str, int]], fetched: list[int]
    ) -> EpochProgress | None:
        """Restore snapshot ``key``, which every rank holds whole, into ``loop`` (a
        collective: every rank checks its read); the epoch to go on with, or None (said).
        ``fetched``: the ranks whose snapshot came from the next node's copy."""
        started = time.perf_counter()
        restored = self._read(key)
        if restored is None:
            return None
        shared, own = restored
        loop.load_state_dict(resharded(shared, loop.run) if self.sharded else shared)
        progress = _progress_of(shared, own)
        self._order = whole[0][key] + 1
        newest = max(int(k.split(":")[0]) for found in whole for k in found)
        where = f"epoch {progress.epoch + 1} batch {progress.batches}" if progress.batches else (
            f"the start of epoch {progress.epoch + 1}")  # fmt: skip
        copies = (f", {ranks_text(fetched, most=8)} from the next node's copy (their node "
                  "was lost)" if fetched else "")  # fmt: skip
        logger.info(f"resumed from memory at step {loop.step} ({where}): "
                    f"{newest - loop.step} completed step(s) lost, 0.0 s read from storage"
                    f"{copies}, {time.perf_counter() - started:.2f} s to restore")  # fmt: skip
        return progress

    def _read(self, key: str) -> tuple[Any, Any] | None:
        """Snapshot ``key`` on this rank, if every rank read its own whole (else None, said)."""
        try:
            restored: tuple[Any, Any] | None = read_snapshot([self.ring, *self.node], key)
            problem = ""
        except CheckpointError as err:
            restored, problem = None, str(err)
        if restored is not None and restored[1]["world_size"] != self.world.world_size:
            restored, problem = None, "it was taken at another world size"
        if all_reduce_max(torch.tensor([float(restored is None)])).item() == 0:
            return restored
        if problem:
            logger.warning(f"memory snapshots: rank {self.world.rank}: {problem}; resuming "
                           "from the checkpoint folder, if any", extra=EVERY_RANK)  # fmt: skip
        return None


def resume_from_memory(snapshots: MemorySnapshots | None, loop: Restorable) -> EpochProgress | None:
    """After a restart, the newest snapshot every rank holds whole, restored into ``loop``;
    the epoch to go on with. None: a first attempt, a rank that keeps no snapshots, or no
    step all hold (the checkpoint folder is next); what memory held is then forgotten, so
    that no later restart goes back to it. A rank that holds nothing of its own (a node lost
    and replaced) takes its snapshot from the next node's copy of it. From then on, with 2
    nodes or more, each snapshot is also copied to the next node.

    Every rank calls it, with snapshots or without, and takes part in the same collectives:
    what decides is agreed, never read off one rank's setup. The launchers of two nodes can
    differ (a node without ``/dev/shm``; a host that joined an elastic job and restarts for
    the first time while the others do for the second).

    Example::

        progress = resume_from_memory(loop.snapshots, loop)
    """
    world = current_world()
    group = _copies_group(snapshots, world)
    if snapshots is not None:
        snapshots.group = group
    try:
        progress = _resume(snapshots, loop, world, group)
        if progress is None and snapshots is not None:
            snapshots.forget()  # (every rank: _resume's outcome is agreed)
        return progress
    finally:
        if snapshots is not None:
            snapshots.start_copies()


def _copies_group(snapshots: MemorySnapshots | None, world: World) -> Any:
    """The copies' group where the job has 2 nodes or more and every rank keeps snapshots
    (None otherwise); a collective then."""
    if world.num_nodes < 2:
        return None
    if all_reduce_max(torch.tensor([float(snapshots is None)])).item() != 0:
        return None
    return copies_group()


def _resume(
    snapshots: MemorySnapshots | None, loop: Restorable, world: World, group: Any
) -> EpochProgress | None:
    mine = snapshots.ring.whole() if snapshots is not None else None
    kept = snapshots.kept.whole() if snapshots is not None and group is not None else {}
    held = (bool(mine) or bool(kept)) and world.restart > 0
    if all_reduce_max(torch.tensor([float(held)])).item() == 0:
        return None  # nothing of this run is in memory anywhere: no more collectives
    everyone = gather_from_ranks({"whole": mine, "kept": kept})
    whole = _held_by_rank(everyone, world, group is not None)
    needy = [rank for rank, found in enumerate(everyone) if not found["whole"] and whole[rank]]
    if any(not found for found in whole):
        missing = [rank for rank, found in enumerate(whole) if not found]
        copies = " nor a copy on the next node" if group is not None else ""
        logger.info(f"memory snapshots: {ranks_text(missing, most=8)} keep none{copies}; "
                    "resuming from the checkpoint folder, if any")  # fmt: skip
        return None
    key = newest_common(whole)
    if key is None or snapshots is None:
        logger.info("memory snapshots: no step every rank holds whole; resuming from the "
                    "checkpoint folder, if any")  # fmt: skip
        return None
    if needy:  # their own were lost with their node: from the copies the next node keeps
        fetch_from_neighbours(key, snapshots.ring, snapshots.kept, needy, group, world)
        barrier()  # a node's ranks read each other's rings: all fetched first
    return snapshots.restore(loop, key, whole, needy)


def _held_by_rank(everyone: list[dict[str, Any]], world: World, copies: bool
                  ) -> list[dict[str, int]]:  # fmt: skip
    """Each rank's snapshots: its own, or (none of its own) the copies the next node keeps."""
    held = []
    for rank, found in enumerate(everyone):
        own = dict(found["whole"] or {})
        holder = (rank + world.local_world_size) % world.world_size
        held.append(own or (dict(everyone[holder]["kept"] or {}) if copies else {}))
    return held


def _progress_of(shared: dict[str, Any], own: dict[str, Any]) -> EpochProgress:
    """The epoch to go on with: part-way at the step, or the next one from its start."""
    saved = own["progress"]
    progress = EpochProgress(int(saved["epoch"]) if saved is not None else int(shared["epoch"]))
    if saved is not None:
        progress.load_local_state(saved)
    progress.rng = own["rng"]
    progress.generator_state = own["loader_generator"]
    return progress
