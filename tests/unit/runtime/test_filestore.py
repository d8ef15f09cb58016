"""Telling a file:// store file in use from one a killed run left (no processes: another
open file description in this process holds the lock as a live rank would)."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch.distributed import FileStore

from ddpkit import ConfigError, RendezvousError
from ddpkit.runtime import filestore
from ddpkit.runtime.filestore import holders_alive, open_file_store


@pytest.fixture(autouse=True)
def release_locks() -> Iterator[None]:
    yield
    for descriptor in filestore._held.values():
        os.close(descriptor)
    filestore._held.clear()


def left_over(path: Path) -> None:
    """A FileStore file whose processes were killed: keys inside, nobody holding the lock
    (one of its 2 ranks closed it, so torch keeps the file for the other)."""
    store = FileStore(str(path), 2)
    store.set("old", "1")
    del store
    assert path.exists()


def live_rank(path: Path, complete: bool = False) -> int:
    """A rank of another job holding the file, its rendezvous over if ``complete``."""
    descriptor = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(descriptor, fcntl.LOCK_SH)
    if complete:
        os.write(descriptor, b"rendezvous complete")
    return descriptor


def test_a_file_written_a_second_ago_by_dead_processes_is_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pg"
    left_over(path)  # age: 0 s, so no age rule could tell
    store = open_file_store(str(path), 2, 5)
    assert not store.check(["old"])
    assert f"removed FileStore file {path} (written 0 s ago) left by a run whose processes" in (
        capsys.readouterr().out
    )
    assert holders_alive(str(path)) is True  # held now, by this rank


def test_a_file_a_live_rank_holds_is_joined_not_removed(tmp_path: Path) -> None:
    path = tmp_path / "pg"
    left_over(path)
    other = live_rank(path)
    try:
        assert holders_alive(str(path)) is True
        store = open_file_store(str(path), 2, 5)
        assert store.check(["old"])  # the live rank's keys are still there
    finally:
        os.close(other)


def test_a_running_jobs_finished_rendezvous_is_refused_after_the_join_timeout(
    tmp_path: Path,
) -> None:
    path = tmp_path / "pg"
    left_over(path)
    other = live_rank(path, complete=True)
    start = time.monotonic()
    try:
        with pytest.raises(RendezvousError, match="belongs to another job that is still running"):
            open_file_store(str(path), 2, 1)
    finally:
        os.close(other)
    assert 1 <= time.monotonic() - start < 4 and path.exists()


def test_a_finished_rendezvous_is_replaced_once_its_processes_let_go(tmp_path: Path) -> None:
    path = tmp_path / "pg"
    left_over(path)
    other = live_rank(path, complete=True)
    threading.Timer(0.5, os.close, (other,)).start()  # the old job's last process exits
    store = open_file_store(str(path), 2, 10)
    assert not store.check(["old"])
    assert Path(f"{path}.lock").read_bytes() == b""  # this job's rendezvous is not over


def test_a_missing_folder_is_named_with_the_mkdir_that_fixes_it(tmp_path: Path) -> None:
    path = tmp_path / "no-such-folder" / "pg"
    with pytest.raises(ConfigError, match=f"mkdir -p {path.parent}"):
        open_file_store(str(path), 2, 30)
