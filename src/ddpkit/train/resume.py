"""The Trainer's checkpoints: when to write them, what they hold, and resuming from them.

A checkpoint is written every ``save_every`` epochs, every ``save_every_steps`` optimizer
steps, at the end of ``fit``, and when a preemption signal asks the job to stop. It holds the
model, optimizer, scheduler, grad scaler, epoch, step and metrics history; taken part-way
through an epoch, also the position in it (:mod:`ddpkit.train.progress`); and every rank's random
generators, gathered to the writer, so each rank takes its own back. After a write is durable
only the newest ``keep_last`` checkpoints are kept.

Resuming takes the newest checkpoint that every rank can load and whose checksum matches. A
truncated, corrupted or unsafe one is reported, renamed ``*.invalid`` and the previous one is
used; if none is usable the run stops instead of starting over. A checkpoint of a different
model (another job sharing the folder) is refused with the differences named.

Example:
    >>> Checkpointer("runs/x", save_every=None, save_every_steps=100, keep_last=3).folder
    PosixPath('runs/x')
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from ddpkit._core.log import EVERY_RANK, logger
from ddpkit._core.validate import check_positive_int
from ddpkit.checkpoint.files import (
    Position,
    list_checkpoints,
    load_checkpoint,
    parse_name,
    prune_checkpoints,
    quarantine,
    remove_stale_temporaries,
    save_checkpoint,
)
from ddpkit.checkpoint.redirect import resolve_checkpoint_dir
from ddpkit.checkpoint.rngstate import capture_rng, gather_from_ranks
from ddpkit.errors import CheckpointError, ConfigError
from ddpkit.parallel.strategy import strategy_of
from ddpkit.runtime.collectives import all_reduce_max, barrier, is_main
from ddpkit.runtime.session import current_world
from ddpkit.train.preemption import exit_preempted
from ddpkit.train.progress import EpochProgress, loader_generator_state
from ddpkit.train.signature import check_same_model, model_signature
from ddpkit.train.state import TrainingRun


def _announced(folder: str | os.PathLike[str]) -> Path:
    """The folder this run uses; said when a ddpkit command redirected it to its scratch."""
    actual = resolve_checkpoint_dir(folder)
    if actual != Path(folder):
        logger.info(f"checkpoints go to {actual} for this run; {folder} is left as it is")
    return actual


class Checkpointer:
    """Writes and resumes the Trainer's checkpoints in ``folder``.

    Example:
        >>> Checkpointer("runs/x", 5, None, None).save_every
        5
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        save_every: int | None,
        save_every_steps: int | None,
        keep_last: int | None,
    ) -> None:
        self.folder = Path(folder)
        self.save_every = save_every
        self.save_every_steps = save_every_steps
        self.keep_last = keep_last
        self._owed = False  # a step checkpoint the epoch's end writes instead

    @classmethod
    def configured(
        cls,
        folder: str | os.PathLike[str] | None,
        save_every: int | None,
        save_every_steps: int | None,
        keep_last: int | None,
    ) -> Checkpointer | None:
        """The Trainer's options checked: a Checkpointer, or None without a folder.

        Example:
            >>> Checkpointer.configured(None, None, None, 3) is None
            True
            >>> Checkpointer.configured(None, 5, None, 3)
            Traceback (most recent call last):
            ...
            ddpkit.errors.ConfigError: save_every needs a checkpoint_dir to save into
        """
        for name, value in (("save_every", save_every), ("save_every_steps", save_every_steps)):
            if value is not None:
                check_positive_int(name, value)
                if folder is None:
                    raise ConfigError(f"{name} needs a checkpoint_dir to save into")
        if keep_last is not None:
            check_positive_int("keep_last", keep_last)
        if folder is None:
            return None
        return cls(_announced(folder), save_every, save_every_steps, keep_last)

    def step_done(
        self, trainer: TrainingRun, progress: EpochProgress, stop: str | None, last: bool
    ) -> None:
        """After an optimizer step: the periodic checkpoint, or the last one before stopping.

        On the epoch's ``last`` batch the epoch's end writes it instead: the same weights,
        with the epoch's metrics, in one write.
        """
        every = self.save_every_steps
        due = every is not None and trainer.step % every == 0
        if last and not stop:
            self._owed = self._owed or due
        elif due or stop:
            path = self.save(trainer, progress.generator_state, progress)
            if stop:
                exit_preempted(stop, _position(trainer, progress).describe(), path)

    def epoch_done(self, trainer: TrainingRun, loader: Any, epochs: int, stop: str | None) -> None:
        """After an epoch: periodic, final, owed by the last step, or stopping."""
        every = self.save_every
        periodic = (every is not None and trainer.epoch % every == 0) or self._owed
        self._owed = False
        if periodic or trainer.epoch == epochs or stop:
            # The loader's generator is now as the next epoch will find it.
            path = self.save(trainer, loader_generator_state(loader), None)
            if stop:
                exit_preempted(stop, _position(trainer, None).describe(), path)

    def save(
        self,
        trainer: TrainingRun,
        generator_state: torch.Tensor | None,
        progress: EpochProgress | None,
    ) -> Path:
        """Write a checkpoint at the trainer's position (a collective); returns its path."""
        position = _position(trainer, progress)
        mine = {"rng": capture_rng(), "loader_generator": generator_state}
        extra = {
            "progress": progress.state_dict() if progress is not None else None,
            "ranks": gather_from_ranks(mine),
            "model_signature": model_signature(trainer.model),
        }
        if strategy_of(trainer.model).sharded:  # every rank writes its shards
            state = {**trainer.state_dict(weights=False), **extra}
            path: Path = _sharded().save_sharded(
                trainer.model, list(trainer.optimizers.values()), state, self.folder, position
            )
        else:  # replicas are identical under DDP: one writer is enough
            path = self.folder / position.name()
            if is_main():
                state = {**trainer.state_dict(), **extra}
                save_checkpoint(state, self.folder, position.epoch, position.step)
        if is_main():
            logger.info(f"saved {path}")
            if self.keep_last is not None:
                prune_checkpoints(self.folder, self.keep_last)  # only after the new one is durable
        return path

    def resume(self, trainer: TrainingRun, loader: Any) -> EpochProgress | None:
        """Load the newest usable checkpoint into ``trainer``; the epoch's position, if any.

        A collective: every rank loads the same checkpoint.
        """
        if is_main():
            remove_stale_temporaries(self.folder)  # no rank is writing yet
        barrier()
        candidates = list_checkpoints(self.folder)
        for path in reversed(candidates):
            _check_format(path, trainer.model)
            state = self._load_agreed(path)
            if state is not None:
                return self._continue_from(path, state, trainer, loader)
        if candidates:
            raise CheckpointError(
                f"none of the {len(candidates)} checkpoint(s) in {self.folder} could be "
                "loaded (see the warnings above); move them away to start from scratch"
            )
        return None

    def _load_agreed(self, path: Path) -> dict[str, Any] | None:
        """The state of ``path`` if every rank loaded and checked it, else None (reported)."""
        try:
            state: dict[str, Any] | None = _read(path)
            problem = ""
        except CheckpointError as err:
            state, problem = None, str(err)
        if all_reduce_max(torch.tensor([float(state is None)])).item() == 0:
            return state
        if problem:
            world = current_world()
            who = f"rank {world.rank}: " if world.world_size > 1 else ""
            logger.warning(f"warning: {who}skipping {path}: {problem}", extra=EVERY_RANK)
        barrier()  # every rank is done with the file before it is renamed
        if is_main() and path.exists():
            logger.info(f"kept it as {quarantine(path).name}; resuming from an older one")
        return None

    def _continue_from(
        self, path: Path, state: dict[str, Any], trainer: TrainingRun, loader: Any
    ) -> EpochProgress:
        check_same_model(state.get("model_signature"), trainer.model, path)
        if path.suffix == ".dcp":
            _sharded().load_sharded(trainer.model, list(trainer.optimizers.values()), path)
        trainer.load_state_dict(state)
        progress = _restored_progress(state, trainer, loader, path)
        where = parse_name(path.name)
        logger.info(
            f"resumed from {path}" + (f" ({where.describe()})" if where else "") + "; to "
            f"start from scratch instead, move {path.parent}'s checkpoints away"
        )
        return progress


def _check_format(path: Path, model: nn.Module) -> None:
    # A refusal, not a damaged file: the checkpoint is fine, the model is not the one for it.
    if path.suffix != ".dcp" and strategy_of(model).sharded:
        raise CheckpointError(
            f"{path} is a whole-model checkpoint but this model is sharded (FSDP); resume "
            "it with the strategy that wrote it, or start a new checkpoint_dir"
        )


def _sharded() -> ModuleType:
    """Sharded checkpoints' module: torch's DCP is imported only when one is written or read."""
    return importlib.import_module("ddpkit.checkpoint.sharded")


def _read(path: Path) -> dict[str, Any]:
    """Load and check this rank's part of a checkpoint; no collective (a rank may fail)."""
    if path.suffix == ".dcp":
        extra: dict[str, Any] = _sharded().read_sharded_extra(path)
        return extra
    return load_checkpoint(path, map_location=current_world().device)


def _restored_progress(
    state: dict[str, Any], trainer: TrainingRun, loader: Any, path: Path
) -> EpochProgress:
    """The first epoch to run after resuming, with this rank's generators to restore."""
    progress = EpochProgress(trainer.epoch, loader)
    world = current_world()
    ranks = state.get("ranks")
    if not ranks:  # written before ddpkit saved random state: as it always resumed
        return progress
    saved_by = len(ranks)
    if saved_by != world.world_size:
        logger.info(
            f"{path.name} was written by {saved_by} rank(s) and this run has "
            f"{world.world_size}: random streams start afresh"
            + (" and the interrupted epoch restarts" if state.get("progress") else "")
        )
        return progress
    mine = ranks[world.rank]
    progress.rng = mine["rng"]
    progress.generator_state = mine["loader_generator"]
    if state.get("progress") is not None:
        progress.load_state_dict(state["progress"])
    return progress


def _position(trainer: TrainingRun, progress: EpochProgress | None) -> Position:
    if progress is None:
        return Position(trainer.epoch)
    return Position(trainer.epoch + 1, trainer.step)
