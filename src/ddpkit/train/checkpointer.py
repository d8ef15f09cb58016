"""A run's checkpoints: when one is due, writing it, and resuming from the newest usable one.

A checkpoint is due every ``save_every`` epochs, every ``save_every_steps`` steps and at the
end (the loop also saves one for a stop signal). It holds the run's ``state_dict``; taken
mid-epoch, the position in it (:mod:`ddpkit.train.progress`), which a run at another world
size goes on from; the world size and global batch; and every rank's random generators,
gathered to the writer. Once a write is durable only ``keep_last`` are kept. Checkpoints live
in a folder or, for a ``checkpoint_dir`` URL such as ``s3://bucket/run``, in an object store
(:mod:`ddpkit.checkpoint.storage`).

Resuming takes the newest checkpoint that every rank can load and whose checksum matches. A
truncated, corrupted or unsafe one is reported, renamed ``*.invalid`` and the previous one is
used; if none is usable the run stops instead of starting over. A checkpoint of a different
model (another job sharing the folder: each checkpoint records the names, dtypes and shapes
of the model's tensors, :mod:`ddpkit.checkpoint.signature`), or in a format this ddpkit does not
know, is refused by name and left as it is.

Example:
    >>> from ddpkit.train.options import CheckpointOptions
    >>> Checkpointer(CheckpointOptions("runs/x", save_every_steps=100)).folder
    LocalFolder('runs/x')
"""

from __future__ import annotations

import importlib
import socket
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import torch
from torch import nn

from ddpkit._core.envvars import positive_int_var
from ddpkit._core.log import EVERY_RANK, logger
from ddpkit._core.protocol import SAVE_AT_STEP_ENV, RecordKind
from ddpkit.checkpoint.background import (
    BackgroundWriter,
    wait_for_writes,
)
from ddpkit.checkpoint.files import Position, parse_name
from ddpkit.checkpoint.redirect import resolve_checkpoint_dir
from ddpkit.checkpoint.rngstate import capture_rng, gather_from_ranks, on_cpu
from ddpkit.checkpoint.savetimes import record_save_seconds
from ddpkit.checkpoint.signature import check_same_model, model_signature
from ddpkit.checkpoint.storage import CheckpointFolder, checkpoint_folder, prune
from ddpkit.errors import CheckpointError, ConfigError
from ddpkit.observe.runsetup import RunSetup
from ddpkit.parallel.strategy import strategy_of, unwrap_model
from ddpkit.runtime.collectives import all_reduce_max, barrier, is_main
from ddpkit.runtime.errorfile import record_failure
from ddpkit.runtime.session import current_world
from ddpkit.train.options import CheckpointOptions
from ddpkit.train.progress import EpochProgress, PartWay
from ddpkit.train.state import upgrade

_SAY_WAIT_S = 0.05  # a save that waited this long for the previous write says so


class Checkpointable(Protocol):
    """What a checkpointer saves and restores: the training loop, as its parts see it."""

    @property
    def model(self) -> nn.Module:
        """The model (or the group of models) trained."""

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimizer, by name."""

    @property
    def setup(self) -> RunSetup | None:
        """How the run is set up (world size, global batch), once it started."""

    @property
    def epoch(self) -> int:
        """Completed epochs."""

    @property
    def step(self) -> int:
        """Optimizer steps taken."""

    def state_dict(self, weights: bool = True) -> dict[str, Any]:
        """Everything needed to resume (``weights=False``: without models and optimizers)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` output."""


class Checkpointer:
    """Writes and resumes a run's checkpoints in ``options.folder`` (or the scratch folder
    a ddpkit command redirected it to).

    Example:
        >>> from ddpkit.train.options import CheckpointOptions
        >>> Checkpointer(CheckpointOptions("runs/x", save_every=5)).due_after_epoch(5, 10)
        True
    """

    def __init__(self, options: CheckpointOptions) -> None:
        assert options.folder is not None
        self.folder, self.where = _announced(options.folder)
        self.options = options
        self.writer = BackgroundWriter() if options.async_save else None
        self._owed = False  # a step checkpoint the epoch's end writes instead
        self.resumed_batch: dict[str, Any] | None = None  # the batch facts resumed from
        self._copy_said = False
        self._save_at = positive_int_var(SAVE_AT_STEP_ENV)
        self._save_started = time.monotonic()

    def due_after_step(self, step: int, last: bool, even: bool = True) -> bool:
        """Whether step ``step``'s checkpoint is due now. At the epoch's ``last`` batch, or in
        an epoch whose ranks cannot meet between batches (not ``even``), the epoch's end
        writes it. ``DDPKIT_SAVE_AT_STEP`` (``ddpkit verify --then``) asks for one right
        after that step, the epoch's last batch included: the run stops there."""
        every = self.options.save_every_steps
        due = every is not None and step % every == 0
        if even and step == self._save_at:
            return True
        if last or not even:
            self._owed = self._owed or due
            return False
        return due

    def due_after_epoch(self, epoch: int, epochs: int) -> bool:
        """Whether a checkpoint is due after ``epoch`` of ``epochs`` (counted from 1)."""
        every = self.options.save_every
        due = (every is not None and epoch % every == 0) or self._owed or epoch == epochs
        self._owed = False
        return due

    def save_here(
        self, run: Checkpointable, part_way: PartWay | None, generator: torch.Tensor | None
    ) -> tuple[str, Position]:
        """A checkpoint where ``run`` stands: an epoch's end, or its step ``part_way`` through
        the epoch; told to the launcher as the newest, should the job stop. ``generator``:
        the training loader's generator state now (an epoch's end keeps it for the next).
        Where it is, and the position.

        Example::

            path, position = checkpointer.save_here(loop, None, generator_state(train_loader))
        """
        epoch, step = run.epoch, run.step
        position = Position(epoch) if part_way is None else Position(epoch + 1, step)
        path = self.save(run, position, part_way, generator)
        said = f"newest checkpoint {path}"
        record_failure(said, said, RecordKind.TRAINING)
        return str(path), position

    def save(
        self,
        run: Checkpointable,
        position: Position,
        part_way: PartWay | None,
        generator: torch.Tensor | None,
    ) -> str:
        """Write a checkpoint at ``position``, ``part_way`` through an epoch (None: after
        it); a collective. Returns where it is (written, or being written)."""
        self._save_started = time.monotonic()
        generator = generator if part_way is None else part_way.generator_state
        mine = {"rng": capture_rng(), "loader_generator": generator, "host": socket.gethostname()}
        extra = {
            "progress": part_way.state if part_way is not None else None,
            "ranks": gather_from_ranks(mine),
            "model_signature": model_signature(unwrap_model(run.model)),
            "batch": run.setup.batch_facts() if run.setup is not None else None,
        }
        if strategy_of(run.model).sharded:  # every rank writes its shards
            name = self._write_sharded(run, {**run.state_dict(weights=False), **extra}, position)
        else:  # replicas are identical under DDP: one writer is enough
            name = position.name()
            if is_main():
                self._write({**run.state_dict(), **extra}, name)
        return self.folder.location(name)

    def wait(self) -> None:
        """Wait for the checkpoint being written in the background, if any (before the
        process ends, or a stop leaves with its checkpoint)."""
        if self.writer is not None:
            self.writer.wait()

    def _write(self, state: dict[str, Any], name: str) -> None:
        if self.writer is None:
            self._write_now(state, name)
            return
        waited, size = self.writer.submit_copy(
            state, lambda copy: self._write_now(copy, name), name
        )
        self._say_copy(size)
        self._waited(waited, name)

    def _write_sharded(self, run: Checkpointable, state: dict[str, Any], where: Position) -> str:
        """Every rank writes its shards, now or (``async_save``) from a copy in the background."""
        sharded, optimizers, folder = _sharded(), list(run.optimizers.values()), self._local()
        name = where.name(".dcp")
        if self.writer is None:
            sharded.save_sharded(run.model, optimizers, state, folder, where)
            self._published(name)
            return name
        self._waited(self.writer.wait(), name)
        self._say_copy(sharded.shard_bytes(run.model, optimizers))
        complete = sharded.start_sharded_save(run.model, optimizers, state, folder, where)
        self.writer.submit(lambda: self._published(complete().name), name)
        return name

    def _say_copy(self, size: int) -> None:
        """The memory a background save costs, said at the first one."""
        if not self._copy_said:
            where = "pinned CPU memory" if torch.cuda.is_available() else "CPU memory"
            logger.info(f"async_save: each save is copied to {where} ({size / 2**20:.0f} MB "
                        "on this rank) and written while training goes on")  # fmt: skip
        self._copy_said = True

    def _waited(self, waited: float, name: str) -> None:
        if waited >= _SAY_WAIT_S:
            logger.info(f"waited {waited:.2f} s for the previous checkpoint's write before "
                        f"saving {name}; save less often to train meanwhile")  # fmt: skip

    def _write_now(self, state: dict[str, Any], name: str) -> None:
        self.folder.write(name, state)
        self._published(name)

    def _published(self, name: str) -> None:
        """Rank 0 says so and prunes, once the new checkpoint is durable."""
        if not is_main():
            return
        logger.info(f"saved {self.folder.location(name)}")
        if self.folder.local is not None:  # for doctor's grace-period check
            record_save_seconds(self.folder.local, time.monotonic() - self._save_started, name)
        if self.options.keep_last is not None:
            prune(self.folder, self.options.keep_last)

    def resume(self, run: Checkpointable) -> EpochProgress | None:
        """Load the newest usable checkpoint into ``run`` (a collective: every rank loads the
        same one); the position in the epoch it was taken in, if any."""
        wait_for_writes()  # a run started again in this process: its last write completes
        if strategy_of(run.model).sharded:
            self._local()  # refused before training, not at the first save
        if is_main():
            self.folder.clean()  # no rank is writing yet
        barrier()
        candidates = self.folder.checkpoints()
        for name in reversed(candidates):
            _check_kind(self.folder.location(name), run.model)
            state = self._load_agreed(name)
            if state is not None:
                return self._continue_from(name, state, run)
        if candidates:
            raise CheckpointError(
                f"none of the {len(candidates)} checkpoint(s) in {self.where} could be "
                "loaded (see the warnings above); move them away to start from scratch"
            )
        return None

    def _load_agreed(self, name: str) -> dict[str, Any] | None:
        """The state of ``name`` if every rank loaded and checked it, else None (reported)."""
        try:
            state: dict[str, Any] | None = self._read(name)
            problem = ""
        except CheckpointError as err:
            state, problem = None, str(err)
        if all_reduce_max(torch.tensor([float(state is None)])).item() == 0:
            return state
        if problem:
            world = current_world()
            who = f"rank {world.rank}: " if world.world_size > 1 else ""
            where = self.folder.location(name)
            logger.warning(f"warning: {who}skipping {where}: {problem}", extra=EVERY_RANK)
        barrier()  # every rank is done with the file before it is renamed
        if is_main():
            kept = self.folder.quarantine(name)
            logger.info(f"kept it as {kept}; resuming from an older one")
        return None

    def _read(self, name: str) -> dict[str, Any]:
        """Load and check this rank's part of a checkpoint; no collective (a rank may fail)."""
        if name.endswith(".dcp"):
            extra: dict[str, Any] = _sharded().read_sharded_extra(self._local() / name)
            return extra
        return self.folder.read(name, map_location=current_world().device)

    def _continue_from(
        self, name: str, state: dict[str, Any], run: Checkpointable
    ) -> EpochProgress:
        where = self.folder.location(name)
        state = upgrade(state, where)
        check_same_model(state.get("model_signature"), unwrap_model(run.model), where)
        if name.endswith(".dcp"):
            _sharded().load_sharded(run.model, list(run.optimizers.values()), self._local() / name)
        run.load_state_dict(state)
        self.resumed_batch = state.get("batch")
        progress = _restored_progress(state, int(state["epoch"]), name)
        position = parse_name(name)
        logger.info(
            f"resumed from {where}" + (f" ({position.describe()})" if position else "") + "; "
            f"to start from scratch instead, move {self.where}'s checkpoints away"
        )
        return progress

    def _local(self) -> Path:
        """The folder on a file system sharded checkpoints need (each rank writes its files)."""
        if self.folder.local is None:
            raise ConfigError(
                f"checkpoint_dir {self.where} is an object store, and FSDP's sharded "
                "checkpoints are written by every rank into a file system folder (local or "
                "shared, e.g. NFS or Lustre); give a path, or use strategy='ddp' to keep "
                "whole-model checkpoints in the object store"
            )
        return self.folder.local


def _announced(folder: Any) -> tuple[CheckpointFolder, str]:
    """The checkpoints this run uses, and where they are; said when a ddpkit command
    redirected them to its scratch."""
    actual = resolve_checkpoint_dir(folder)
    if str(actual) != str(folder):
        logger.info(f"checkpoints go to {actual} for this run; {folder} is left as it is")
    return checkpoint_folder(actual), str(actual)


def _check_kind(where: str, model: nn.Module) -> None:
    # A refusal, not a damaged file: the checkpoint is fine, the model is not the one for it.
    if not where.endswith(".dcp") and strategy_of(model).sharded:
        raise CheckpointError(
            f"{where} is a whole-model checkpoint but this model is sharded (FSDP); resume "
            "it with the strategy that wrote it, or start a new checkpoint_dir"
        )


def _sharded() -> ModuleType:
    """Sharded checkpoints' module: torch's DCP is imported only when one is written or read."""
    return importlib.import_module("ddpkit.checkpoint.sharded")


def _restored_progress(state: dict[str, Any], epoch: int, name: str) -> EpochProgress:
    """The first epoch to run after resuming, with this rank's generators to restore."""
    progress = EpochProgress(epoch)
    world = current_world()
    ranks = state["ranks"]
    if not ranks:  # written before ddpkit saved random state: as it always resumed
        return progress
    if len(ranks) != world.world_size:
        saved = state.get("progress")
        if saved is not None:
            progress.load_state_dict(saved, same_world=False)
        logger.info(
            f"{name} was written by {len(ranks)} rank(s) and this run has "
            f"{world.world_size}{_membership(ranks)}: random streams start afresh"
            + _where_it_goes_on(saved)
        )
        return progress
    mine = on_cpu(ranks[world.rank])  # read onto this rank's device, a GPU too
    progress.rng = mine["rng"]
    progress.generator_state = mine["loader_generator"]
    if state.get("progress") is not None:
        progress.load_state_dict(state["progress"])
    return progress


def _where_it_goes_on(saved: dict[str, Any] | None) -> str:
    """What happens to the interrupted epoch, if any, at another world size."""
    if saved is None:
        return ""
    if saved.get("samples") is None:
        return " and the interrupted epoch restarts (its loader cannot go on at a position)"
    return (f", and epoch {int(saved['epoch']) + 1} goes on after the {saved['samples']} "
            "samples the ranks had done, each of the others once")  # fmt: skip


def _membership(ranks: list[dict[str, Any]]) -> str:
    """Which hosts left or joined since the checkpoint's ranks wrote it (a collective)."""
    before = {rank["host"] for rank in ranks if "host" in rank}
    now = {rank["host"] for rank in gather_from_ranks({"host": socket.gethostname()})}
    if not before or before == now:
        return ""
    changes = [f"{', '.join(sorted(before - now))} left"] if before - now else []
    changes += [f"{', '.join(sorted(now - before))} joined"] if now - before else []
    return f" ({'; '.join(changes)})"


def record_training_start(checkpointer: Checkpointer | None) -> None:
    """Where training stands, for the launcher, should a stop come before the first save.

    Example::

        record_training_start(None)   # the launcher's report: "no checkpoint_dir"
    """
    where = "no checkpoint yet" if checkpointer else "no checkpoint_dir"
    record_failure(where, where, RecordKind.TRAINING)
