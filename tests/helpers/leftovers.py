"""What a test run leaves in the temporary folder: ``make test`` marks its start, then fails
when a ``pytorch-errorfile-*`` or ``ddpkit-*`` entry made since is still there.

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


def leftovers(since: float, folder: Path) -> list[Path]:
    """The entries of ``folder`` matching :data:`PATTERNS` changed at ``since`` or later."""
    found = [path for pattern in PATTERNS for path in folder.glob(pattern)]
    return sorted(path for path in found if path.lstat().st_mtime >= since)


def main(command: str) -> int:
    if command == "start":
        STAMP.parent.mkdir(parents=True, exist_ok=True)
        STAMP.write_text(f"{time.time() - 1:.3f}")
        return 0
    since = float(STAMP.read_text())
    left = leftovers(since, Path(tempfile.gettempdir()))
    for path in left:
        print(f"make test left {path} in the temporary folder", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
