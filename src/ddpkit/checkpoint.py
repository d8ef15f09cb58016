"""Checkpoints on disk: atomic writes by one process, safe loads by all.

A checkpoint is a plain ``dict`` of tensors and plain data saved with ``torch.save``, so it
loads without ddpkit. Writes go to a temporary file in the same directory, are flushed and
fsynced, then renamed over the final name and the directory is fsynced: a crash mid-write
leaves the previous checkpoint untouched. Loads use ``torch.load(weights_only=True)``, which
refuses pickled code.

Example:
    >>> import tempfile, torch
    >>> folder = tempfile.mkdtemp()
    >>> path = save_checkpoint({"epoch": 2, "w": torch.ones(2)}, folder, epoch=2)
    >>> load_checkpoint(latest_checkpoint(folder))["epoch"]
    2
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from ddpkit.errors import CheckpointError

_NAME = re.compile(r"^epoch_(\d{6,})\.(pt|dcp)$")  # .dcp: a sharded (FSDP) checkpoint dir


def checkpoint_name(epoch: int) -> str:
    """File name of the checkpoint taken after ``epoch`` completed epochs.

    Example:
        >>> checkpoint_name(12)
        'epoch_000012.pt'
    """
    return f"epoch_{epoch:06d}.pt"


def save_checkpoint(state: dict[str, Any], folder: str | os.PathLike[str], epoch: int) -> Path:
    """Write ``state`` atomically as ``folder/epoch_NNNNNN.pt`` and return its path.

    Example:
        >>> import tempfile
        >>> save_checkpoint({"epoch": 1}, tempfile.mkdtemp(), epoch=1).name
        'epoch_000001.pt'
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / checkpoint_name(epoch)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, final)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_directory(folder)
    return final


def list_checkpoints(folder: str | os.PathLike[str]) -> list[Path]:
    """Checkpoints in ``folder``, oldest epoch first: ``.pt`` files and sharded ``.dcp``
    directories (temporary files are ignored).

    Example:
        >>> import tempfile
        >>> list_checkpoints(tempfile.mkdtemp())
        []
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [path for _, path in sorted(found)]


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
    path: str | os.PathLike[str], map_location: torch.device | str = "cpu"
) -> dict[str, Any]:
    """Load a checkpoint safely (``weights_only=True``) onto ``map_location``.

    Example:
        >>> import tempfile
        >>> p = save_checkpoint({"epoch": 3}, tempfile.mkdtemp(), epoch=3)
        >>> load_checkpoint(p)["epoch"]
        3
    """
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except Exception as err:  # torch raises several types for a torn or foreign file
        raise CheckpointError(
            f"checkpoint {path} could not be loaded safely ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); it may be truncated, or hold "
            "objects other than tensors and plain data"
        ) from err
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, not a dict")
    return state


def fsync_directory(folder: Path) -> None:
    """Make a rename in ``folder`` durable: it is only on disk once the directory entry is.

    Example:
        >>> import tempfile
        >>> fsync_directory(Path(tempfile.mkdtemp()))
    """
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
