"""Checkpoint files: named by where training was, written atomically, checked on load.

A name says the position: ``epoch_000004.pt`` is the state after 4 complete epochs;
``epoch_000005_step_000412.pt`` was taken part-way through epoch 5, after 412 optimizer
steps in all. Sharded (FSDP) checkpoints are directories with the same names and ``.dcp``.
Sorted by position, the last is the one to resume from.

A checkpoint is a plain ``dict`` of tensors and plain data saved with ``torch.save``, so it
loads without ddpkit. A write goes to a temporary file in the same directory, is flushed and
fsynced, renamed over the final name, and the directory is fsynced: a crash at any moment
leaves the old files or the new one complete, never a torn one, and older checkpoints are
only pruned once the new one is durable. Each checkpoint carries a digest of its contents
(:mod:`ddpkit.checkpoint.integrity`), checked on load, so a truncated or corrupted file is reported
instead of loaded. Loads use ``torch.load(weights_only=True)``, which refuses pickled code;
to load a checkpoint holding your own classes, allow them by name first with torch's
``torch.serialization.add_safe_globals([MyClass])``.

Example:
    >>> import tempfile, torch
    >>> folder = tempfile.mkdtemp()
    >>> path = save_checkpoint({"epoch": 2, "w": torch.ones(2)}, folder, epoch=2)
    >>> load_checkpoint(latest_checkpoint(folder))["epoch"]
    2
"""

from __future__ import annotations

import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from ddpkit._core.atomicfile import atomic_write, fsync_directory
from ddpkit.checkpoint.integrity import seal, verify_seal
from ddpkit.checkpoint.savetimes import SAVE_TIMES_FILE
from ddpkit.errors import CheckpointError, ConfigError

_NAME = re.compile(r"^epoch_(\d{6,})(?:_step_(\d{6,}))?\.(pt|dcp)$")
INVALID_SUFFIX = ".invalid"  # a checkpoint that failed its checks, kept for inspection


@dataclass(frozen=True)
class Position:
    """Where training was when a checkpoint was taken.

    ``epoch`` counts from 1; ``step`` (optimizer steps in all) is set for a checkpoint taken
    part-way through that epoch, and None for one taken at its end.

    Example:
        >>> Position(5, 412).name(), Position(4).name()
        ('epoch_000005_step_000412.pt', 'epoch_000004.pt')
        >>> Position(4) < Position(5, 412) < Position(5)
        True
    """

    epoch: int
    step: int | None = None

    def name(self, suffix: str = ".pt") -> str:
        """The file (or directory) name for this position."""
        middle = "" if self.step is None else f"_step_{self.step:06d}"
        return f"epoch_{self.epoch:06d}{middle}{suffix}"

    def describe(self) -> str:
        """For log lines: 'the end of epoch 4' or 'epoch 5, step 412'."""
        return f"the end of epoch {self.epoch}" if self.step is None else (
            f"epoch {self.epoch}, step {self.step}")  # fmt: skip

    def __lt__(self, other: Position) -> bool:
        return self._key() < other._key()

    def _key(self) -> tuple[int, float]:
        return (self.epoch, math.inf if self.step is None else self.step)


def parse_name(name: str) -> Position | None:
    """The position a checkpoint name stands for, or None for any other name.

    Example:
        >>> parse_name("epoch_000005_step_000412.dcp")
        Position(epoch=5, step=412)
        >>> parse_name(".epoch_000005.pt.x1.tmp") is None
        True
    """
    match = _NAME.match(name)
    if match is None:
        return None
    return Position(int(match.group(1)), int(match.group(2)) if match.group(2) else None)


def checkpoint_name(epoch: int, step: int | None = None) -> str:
    """File name of the checkpoint at the end of ``epoch`` (or at ``step`` within it).

    Example:
        >>> checkpoint_name(12)
        'epoch_000012.pt'
    """
    return Position(epoch, step).name()


def save_checkpoint(
    state: dict[str, Any], folder: str | os.PathLike[str], epoch: int, step: int | None = None
) -> Path:
    """Seal ``state`` with its digest and write it atomically; returns its path.

    Example:
        >>> import tempfile
        >>> save_checkpoint({"epoch": 1}, tempfile.mkdtemp(), epoch=1).name
        'epoch_000001.pt'
    """
    final = Path(folder) / checkpoint_name(epoch, step)
    save_sealed(state, final)
    return final


def save_sealed(state: dict[str, Any], final: Path) -> None:
    """Write ``state`` with its digest to ``final``, atomically.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "trainer.pt"
        >>> save_sealed({"epoch": 1}, target); sorted(load_checkpoint(target))
        ['epoch', 'integrity']
    """
    sealed = seal(state)
    atomic_write(final, lambda handle: torch.save(sealed, handle))


def list_checkpoints(folder: str | os.PathLike[str]) -> list[Path]:
    """Checkpoints in ``folder``, oldest position first: ``.pt`` files and sharded ``.dcp``
    directories (temporary and invalid ones are left out).

    Example:
        >>> import tempfile
        >>> list_checkpoints(tempfile.mkdtemp())
        []
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(position, p) for p in folder.iterdir() if (position := parse_name(p.name))]
    return [path for _, path in sorted(found, key=lambda pair: pair[0]._key())]


def latest_checkpoint(folder: str | os.PathLike[str]) -> Path | None:
    """The newest checkpoint in ``folder``, or None when there is none.

    Example:
        >>> import tempfile
        >>> latest_checkpoint(tempfile.mkdtemp()) is None
        True
    """
    found = list_checkpoints(folder)
    return found[-1] if found else None


def load_checkpoint(
    path: str | os.PathLike[str] | IO[bytes],
    map_location: torch.device | str = "cpu",
    name: str | None = None,
) -> dict[str, Any]:
    """Load a checkpoint safely (``weights_only=True``) and check its digest.

    ``path`` may also be an open binary file (a checkpoint read from an object store);
    ``name`` says where it came from in messages. Raises
    :class:`~ddpkit.errors.CheckpointError` for a missing, truncated, corrupted or foreign
    file (one holding objects other than tensors and plain data).

    Example:
        >>> import tempfile
        >>> p = save_checkpoint({"epoch": 3}, tempfile.mkdtemp(), epoch=3)
        >>> load_checkpoint(p)["epoch"]
        3
    """
    name = name or str(path)
    state = _load_weights_only(path, map_location, name)
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {name} holds a {type(state).__name__}, not a dict")
    if verify_seal(state) == "mismatch":
        raise CheckpointError(
            f"checkpoint {name} is corrupted: its contents do not match the checksum written "
            "with them (a damaged disk or a partial copy)"
        )
    return state


def _load_weights_only(path: Any, map_location: Any, name: str) -> Any:
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {name} does not exist") from None
    except Exception as err:  # torch raises several types for a torn or foreign file
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise CheckpointError(
            f"checkpoint {name} could not be loaded safely ({type(err).__name__}: {first}); "
            "it may be truncated, or hold objects other than tensors and plain data (which "
            "weights_only loading refuses to run; allow your own classes with "
            "torch.serialization.add_safe_globals)"
        ) from err


def prune_checkpoints(folder: str | os.PathLike[str], keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints; returns what was deleted.

    Call it only once the newest checkpoint is durable: what it deletes is then older.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> for epoch in (1, 2, 3):
        ...     _ = save_checkpoint({"epoch": epoch}, folder, epoch=epoch)
        >>> [p.name for p in prune_checkpoints(folder, keep=2)]
        ['epoch_000001.pt']
    """
    if keep < 1:
        raise ConfigError(f"keep must be >= 1 (got {keep})")
    doomed = list_checkpoints(folder)[:-keep]
    for path in doomed:
        remove_path(path)
    return doomed


def quarantine(path: Path) -> Path:
    """Rename a checkpoint that failed its checks so it is kept but never resumed from.

    Example:
        >>> import tempfile
        >>> bad = Path(tempfile.mkdtemp()) / "epoch_000002.pt"; _ = bad.write_bytes(b"torn")
        >>> quarantine(bad).name
        'epoch_000002.pt.invalid'
    """
    target = path.with_name(path.name + INVALID_SUFFIX)
    remove_path(target)  # an older invalid copy of the same position
    os.replace(path, target)
    fsync_directory(path.parent)
    return target


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete temporary files and directories that interrupted writes left behind.

    Only safe while no write is in progress in ``folder`` (ddpkit calls it before training
    starts, when no rank has begun writing).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / ".epoch_000001.pt.ab.tmp").write_bytes(b"")
        >>> _ = (folder / f".{SAVE_TIMES_FILE}.cd.tmp").write_bytes(b"")
        >>> sorted(p.name for p in remove_stale_temporaries(folder))
        ['..save-seconds.json.cd.tmp', '.epoch_000001.pt.ab.tmp']
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    # atomic_write's temporaries: .<final name>.<random>.tmp, of a checkpoint or the save times
    ours = (".epoch_", f".{SAVE_TIMES_FILE}.")
    stale = [p for p in folder.iterdir() if p.name.startswith(ours) and p.suffix == ".tmp"]
    for path in stale:
        remove_path(path)
    return stale


def remove_path(path: Path) -> None:
    """Remove a file or a directory tree; nothing when it is not there.

    Example:
        >>> remove_path(Path("/nonexistent/epoch_000001.pt"))
    """
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
