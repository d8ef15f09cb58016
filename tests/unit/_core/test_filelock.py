"""Who holds a file's lock: a live process, nobody, no file at all, or a file we cannot open."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpkit._core.filelock import LockHolder, holding, lock_holder


def test_a_lock_held_by_another_process_is_seen_and_freed_when_it_ends(tmp_path: Path) -> None:
    path = tmp_path / "owner"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from ddpkit._core.filelock import holding\n"
         f"with holding({str(path)!r}):\n    print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    assert lock_holder(path) is LockHolder.LIVE_PROCESS
    holder.kill()
    holder.wait()
    assert lock_holder(path) is LockHolder.NOBODY


def test_no_file_and_a_file_held_here(tmp_path: Path) -> None:
    assert lock_holder(tmp_path / "none") is LockHolder.NO_FILE
    with holding(tmp_path / "mine"):
        assert lock_holder(tmp_path / "mine") is LockHolder.LIVE_PROCESS


@pytest.mark.skipif(os.geteuid() == 0, reason="root opens any file")
def test_a_file_we_may_not_open_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / "theirs"
    path.write_text("")
    path.chmod(0)
    assert lock_holder(path) is LockHolder.UNKNOWN
