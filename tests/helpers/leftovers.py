"""What a test run leaves in the temporary folder and in ``/dev/shm`` (where memory snapshots
live): ``make test`` marks its start, then fails when a ``pytorch-errorfile-*`` or ``ddpkit-*``
entry made since is still there, or in ``/dev/shm`` a ``tmp*`` folder (a server's scratch).

    python tests/helpers/leftovers.py start    # before the tests
    python tests/helpers/leftovers.py check    # after them: exit 1, naming each leftover
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

STAMP = Path(__file__).resolve().parents[2] / "runs" / ".tests-started"
PATTERNS = ("pytorch-errorfile-*", "ddpkit-*")
SHARED_MEMORY = Path("/dev/shm")


def leftovers(since: float, folder: Path, patterns: tuple[str, ...] = PATTERNS) -> list[Path]:
    """The entries of ``folder`` matching ``patterns`` changed at ``since`` or later."""
    found = [path for pattern in patterns for path in folder.glob(pattern)]
    return sorted(path for path in found if path.lstat().st_mtime >= since)


def main(command: str) -> int:
    if command == "start":
        STAMP.parent.mkdir(parents=True, exist_ok=True)
        STAMP.write_text(f"{time.time() - 1:.3f}")
        return 0
    since = float(STAMP.read_text())
    left = leftovers(since, Path(tempfile.gettempdir()))
    if SHARED_MEMORY.is_dir():
        left += leftovers(since, SHARED_MEMORY, (*PATTERNS, "tmp*"))
    for path in left:
        print(f"make test left {path} behind", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
