"""A run's checkpoints: when one is due, writing it, and resuming from the newest usable one.

A checkpoint is due every ``save_every`` epochs, every ``save_every_steps`` steps and at the
end (the loop also saves one for a stop signal). It holds the run's ``state_dict``; taken
mid-epoch, the position in it (:mod:`ddpkit.train.progress`); and every rank's random
generators, gathered to the writer. Once a write is durable only ``keep_last`` are kept.

Resuming takes the newest checkpoint that every rank can load and whose checksum matches. A
truncated, corrupted or unsafe one is reported, renamed ``*.invalid`` and the previous one is
used; if none is usable the run stops instead of starting over. A checkpoint of a different
model (another job sharing the folder: each checkpoint records the names, dtypes and shapes
of the model's tensors, :func:`model_signature`), or in a format this ddpkit does not know,
is refused by name and left as it is.

Example:
    >>> from ddpkit.train.options import CheckpointOptions
    >>> Checkpointer(CheckpointOptions("runs/x", save_every_steps=100)).folder
    PosixPath('runs/x')
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import torch
from torch import nn

from ddpkit._core.log import EVERY_RANK, logger
from ddpkit.checkpoint.background import BackgroundWriter, snapshot, wait_for_writes
from ddpkit.checkpoint.files import (
    Position,
    list_checkpoints,
    load_checkpoint,
    parse_name,
    prune_checkpoints,
    quarantine,
    remove_stale_temporaries,
    save_sealed,
)
from ddpkit.checkpoint.redirect import resolve_checkpoint_dir
from ddpkit.checkpoint.rngstate import capture_rng, gather_from_ranks
from ddpkit.errors import CheckpointError
from ddpkit.parallel.strategy import strategy_of, unwrap_model
from ddpkit.runtime.collectives import all_reduce_max, barrier, is_main
from ddpkit.runtime.session import current_world
from ddpkit.train.options import CheckpointOptions
from ddpkit.train.progress import EpochProgress, loader_generator_state
from ddpkit.train.state import upgrade

_SHOWN = 3  # differences named when a checkpoint of another model is refused
_SAY_WAIT_S = 0.05  # a save that waited this long for the previous write says so


class Checkpointable(Protocol):
    """What a checkpointer saves and restores: the training loop, as its parts see it."""

    @property
    def model(self) -> nn.Module:
        """The model (or the group of models) trained."""

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimizer, by name."""

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
        self.folder = _announced(options.folder)
        self.options = options
        self.writer = BackgroundWriter() if options.async_save else None
        self._owed = False  # a step checkpoint the epoch's end writes instead

    def due_after_step(self, step: int, defer: bool) -> bool:
        """Whether step ``step``'s checkpoint is due now. ``defer`` (the epoch's last batch,
        or an epoch whose ranks cannot meet between batches): the epoch's end writes it."""
        every = self.options.save_every_steps
        due = every is not None and step % every == 0
        if defer:
            self._owed = self._owed or due
            return False
        return due

    def due_after_epoch(self, epoch: int, epochs: int) -> bool:
        """Whether a checkpoint is due after ``epoch`` of ``epochs`` (counted from 1)."""
        every = self.options.save_every
        due = (every is not None and epoch % every == 0) or self._owed or epoch == epochs
        self._owed = False
        return due

    def save(
        self, run: Checkpointable, position: Position, progress: EpochProgress | None, loader: Any
    ) -> Path:
        """Write a checkpoint at ``position``, part-way through ``progress`` (None: after an
        epoch); a collective. Returns its path."""
        generator = loader_generator_state(loader) if progress is None else progress.generator_state
        extra = {
            "progress": progress.state_dict() if progress is not None else None,
            "ranks": gather_from_ranks({"rng": capture_rng(), "loader_generator": generator}),
            "model_signature": model_signature(run.model),
        }
        if strategy_of(run.model).sharded:  # every rank writes its shards
            state = {**run.state_dict(weights=False), **extra}
            optimizers = list(run.optimizers.values())
            path: Path = _sharded().save_sharded(
                run.model, optimizers, state, self.folder, position
            )
            if is_main():
                self._published(path)
        else:  # replicas are identical under DDP: one writer is enough
            path = self.folder / position.name()
            if is_main():
                self._write({**run.state_dict(), **extra}, path)
        return path

    def wait(self) -> None:
        """Wait for the checkpoint being written in the background, if any (before the
        process ends, or a stop leaves with its checkpoint)."""
        if self.writer is not None:
            self.writer.wait()

    def _write(self, state: dict[str, Any], path: Path) -> None:
        if self.writer is None:
            self._write_now(state, path)
            return
        frozen = snapshot(state)  # training goes on once the copy is taken
        waited = self.writer.submit(lambda: self._write_now(frozen, path), path.name)
        if waited >= _SAY_WAIT_S:
            logger.info(f"waited {waited:.2f} s for the previous checkpoint's write before "
                        f"saving {path.name}; save less often to train meanwhile")  # fmt: skip

    def _write_now(self, state: dict[str, Any], path: Path) -> None:
        save_sealed(state, path)
        self._published(path)

    def _published(self, path: Path) -> None:
        logger.info(f"saved {path}")
        if self.options.keep_last is not None:  # only after the new one is durable
            prune_checkpoints(self.folder, self.options.keep_last)

    def resume(self, run: Checkpointable, loader: Any) -> EpochProgress | None:
        """Load the newest usable checkpoint into ``run`` (a collective: every rank loads the
        same one); the position in the epoch it was taken in, if any."""
        wait_for_writes()  # a run started again in this process: its last write completes
        if is_main():
            remove_stale_temporaries(self.folder)  # no rank is writing yet
        barrier()
        candidates = list_checkpoints(self.folder)
        for path in reversed(candidates):
            _check_kind(path, run.model)
            state = self._load_agreed(path)
            if state is not None:
                return self._continue_from(path, upgrade(state, path), run, loader)
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
        self, path: Path, state: dict[str, Any], run: Checkpointable, loader: Any
    ) -> EpochProgress:
        check_same_model(state.get("model_signature"), run.model, path)
        if path.suffix == ".dcp":
            _sharded().load_sharded(run.model, list(run.optimizers.values()), path)
        run.load_state_dict(state)
        progress = _restored_progress(state, int(state["epoch"]), loader, path)
        where = parse_name(path.name)
        logger.info(
            f"resumed from {path}" + (f" ({where.describe()})" if where else "") + "; to "
            f"start from scratch instead, move {path.parent}'s checkpoints away"
        )
        return progress


def _announced(folder: Any) -> Path:
    """The folder this run uses; said when a ddpkit command redirected it to its scratch."""
    actual = resolve_checkpoint_dir(folder)
    if actual != Path(folder):
        logger.info(f"checkpoints go to {actual} for this run; {folder} is left as it is")
    return actual


def _check_kind(path: Path, model: nn.Module) -> None:
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


def _restored_progress(state: dict[str, Any], epoch: int, loader: Any, path: Path) -> EpochProgress:
    """The first epoch to run after resuming, with this rank's generators to restore."""
    progress = EpochProgress(epoch, loader)
    world = current_world()
    ranks = state["ranks"]
    if not ranks:  # written before ddpkit saved random state: as it always resumed
        return progress
    if len(ranks) != world.world_size:
        logger.info(
            f"{path.name} was written by {len(ranks)} rank(s) and this run has "
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


def model_signature(model: nn.Module) -> dict[str, str]:
    """``{name: "dtype[shape]"}`` for every tensor of the (unwrapped) model's state.

    FSDP's sharded parameters report their whole shape, so every rank signs alike.

    Example:
        >>> model_signature(nn.Linear(3, 2))
        {'weight': 'float32[2, 3]', 'bias': 'float32[2]'}
    """
    return {
        name: f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
        for name, value in unwrap_model(model).state_dict().items()
        if hasattr(value, "shape")
    }


def check_same_model(recorded: Any, model: nn.Module, path: Path) -> None:
    """Refuse a checkpoint whose recorded signature is not this model's.

    A checkpoint without a signature (written before ddpkit recorded one) is let through:
    loading its weights then checks names and shapes.

    Example:
        >>> check_same_model({"weight": "float32[9]"}, nn.Linear(1, 1), Path("e.pt"))
        Traceback (most recent call last):
        ...
        ddpkit.errors.CheckpointError: e.pt is a checkpoint of a different model ...
    """
    if not isinstance(recorded, dict):
        return
    differences = describe_differences(recorded, model_signature(model))
    if differences:
        more = f"; {len(differences) - _SHOWN} more differ" if len(differences) > _SHOWN else ""
        raise CheckpointError(
            f"{path} is a checkpoint of a different model ({'; '.join(differences[:_SHOWN])}"
            f"{more}). Another job may share this checkpoint_dir: give each model its own "
            f"folder, or move {path.parent}'s checkpoints away to start from scratch"
        )


def describe_differences(saved: dict[str, str], current: dict[str, str]) -> list[str]:
    """One line per tensor that is missing, extra, or shaped differently.

    Example:
        >>> describe_differences({"w": "float32[2]"}, {"w": "float32[3]", "b": "float32[1]"})
        ['w is float32[2] there, float32[3] here', 'b is only in this model']
    """
    lines = [
        f"{name} is {saved[name]} there, {current[name]} here"
        for name in saved
        if name in current and saved[name] != current[name]
    ]
    lines += [f"{name} is only in the checkpoint" for name in saved if name not in current]
    lines += [f"{name} is only in this model" for name in current if name not in saved]
    return lines
