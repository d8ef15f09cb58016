"""How long the last checkpoint took to write, kept beside the checkpoints.

A stop signal (a pod deleted, a node drained, a SLURM preemption) gives a job a grace period
before SIGKILL; ddpkit spends it writing one checkpoint. Whether the grace period is long
enough is a measured question, so rank 0 records each save's seconds in the checkpoint
folder (``.save-seconds.json``) and ``ddpkit doctor --checkpoint-dir`` compares the slowest of
the last few with the grace period.

Example:
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> record_save_seconds(folder, 12.5, "epoch_000003.pt"); slowest_save(folder)
    (12.5, 'epoch_000003.pt')
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddpkit._core.atomicfile import atomic_write

SAVE_TIMES_FILE = ".save-seconds.json"  # hidden: the folder lists checkpoints
_KEPT = 5  # the last few saves: one slow save on a busy file system counts


def record_save_seconds(folder: Path, seconds: float, name: str) -> None:
    """Add one save's seconds to ``folder``'s record (atomically; a failure only loses it).

    Example:
        >>> record_save_seconds(Path("/nonexistent/folder"), 1.0, "x.pt")  # no error
    """
    saves = [*_read(folder), {"name": name, "seconds": round(seconds, 3)}][-_KEPT:]
    text = json.dumps(saves).encode()
    try:
        if folder.is_dir():  # made by the save it records; never made here
            atomic_write(folder / SAVE_TIMES_FILE, lambda out: out.write(text))
    except OSError:
        pass  # a record for doctor is not worth failing a save for


def slowest_save(folder: Path) -> tuple[float, str] | None:
    """The slowest of the last recorded saves in ``folder``: (seconds, checkpoint name).

    Example:
        >>> slowest_save(Path("/nonexistent")) is None
        True
    """
    saves = _read(folder)
    if not saves:
        return None
    slowest = max(saves, key=lambda save: save["seconds"])
    return float(slowest["seconds"]), str(slowest["name"])


def _read(folder: Path) -> list[dict[str, Any]]:
    try:
        saves = json.loads((folder / SAVE_TIMES_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [s for s in saves if isinstance(s, dict) and isinstance(s.get("seconds"), float | int)]
