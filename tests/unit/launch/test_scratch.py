"""A launch's scratch folder: removed by its launcher, and by the next launch when its
launcher died without removing it (kill -9), never while its launcher lives."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest

from ddpkit._core.protocol import ERROR_FILE_ENV, error_record, write_error_file
from ddpkit.launch.scratch import (
    OWNER,
    PREFIX,
    SWEPT,
    UNOWNED_AFTER_S,
    memory_folder,
    sweep_dead_launchers,
)


def scratch(root: Path, name: str, owned: bool = True) -> Path:
    folder = root / f"{PREFIX}{name}"
    folder.mkdir()
    if owned:
        (folder / OWNER).write_text("")
    return folder


def test_a_folder_whose_launcher_holds_its_lock_is_kept_and_swept_once_released(
    tmp_path: Path,
) -> None:
    folder = scratch(tmp_path, "live")
    with (folder / OWNER).open("w") as owner:  # the launcher, alive
        fcntl.flock(owner, fcntl.LOCK_EX)
        assert sweep_dead_launchers(str(tmp_path)) == []
        assert folder.exists()
    # its process gone (the kernel releases the lock, as on kill -9)
    assert sweep_dead_launchers(str(tmp_path)) == [str(folder)]
    assert not folder.exists()


def test_a_folder_without_an_owner_file_is_kept_unless_a_day_old(tmp_path: Path) -> None:
    young, old = scratch(tmp_path, "young", owned=False), scratch(tmp_path, "old", owned=False)
    a_day_ago = time.time() - UNOWNED_AFTER_S - 60
    os.utime(old, (a_day_ago, a_day_ago))  # left by a ddpkit before owner files
    assert sweep_dead_launchers(str(tmp_path)) == [str(old)]
    assert young.exists()


def test_other_folders_in_the_temporary_directory_are_left_alone(tmp_path: Path) -> None:
    other = tmp_path / "torchelastic_abc"
    other.mkdir()
    (other / OWNER).write_text("")
    (tmp_path / f"{PREFIX}a-file").write_text("not a folder")
    assert sweep_dead_launchers(str(tmp_path)) == []
    assert other.exists()


def test_a_dead_launchers_worker_ending_after_the_sweep_does_not_bring_its_folder_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker of a launcher killed with -9 gets SIGTERM and records it in its error
    file, in the launcher's folder; on a busy machine that can come after the next launch
    swept the folder, which the write then made again, left behind for good (seen in CI)."""
    folder = scratch(tmp_path, "killed")
    error_file = folder / "attempt_0" / "0" / "error.json"  # torch's layout
    error_file.parent.mkdir(parents=True)
    monkeypatch.setenv(ERROR_FILE_ENV, str(error_file))
    assert sweep_dead_launchers(str(tmp_path)) == [str(folder)]
    write_error_file(error_record("stopped by SIGTERM", "the launcher is gone"))
    assert list(tmp_path.iterdir()) == []


def test_a_folder_a_killed_sweep_was_removing_is_removed_by_the_next(tmp_path: Path) -> None:
    half_removed = tmp_path / f"{PREFIX}abc{SWEPT}"  # renamed; its owner file already gone
    (half_removed / "attempt_0").mkdir(parents=True)
    assert sweep_dead_launchers(str(tmp_path)) == [str(half_removed)]
    assert list(tmp_path.iterdir()) == []


def test_a_launcher_killed_while_removing_its_folder_leaves_one_the_next_sweep_removes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in CI: a launcher killed with -9 halfway through removing its own folder (its
    owner file already gone) left the rest, kept for a day as a folder being made. The
    folder is renamed before it is removed, so what a kill leaves is marked as swept."""
    from ddpkit.launch import scratch as module

    monkeypatch.setattr(module.shutil, "rmtree", lambda *_, **__: None)  # killed there
    with module.launch_folder(str(tmp_path)) as folder:
        Path(folder, "attempt_0", "1").mkdir(parents=True)
    (left,) = tmp_path.iterdir()
    assert left.name == Path(folder).name + SWEPT
    monkeypatch.undo()
    assert sweep_dead_launchers(str(tmp_path)) == [str(left)]
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_while_a_launcher_makes_its_folder_never_takes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another launch's sweep runs at the worst moment: just before this launcher locks its
    owner file. The owner file is not there yet under its name (it appears locked), so the
    new folder is a young one without an owner, and stays."""
    from ddpkit.launch import scratch as module

    monkeypatch.setattr(module.tempfile, "tempdir", str(tmp_path))
    real_flock, swept = fcntl.flock, []

    def sweep_then_lock(file: object, operation: int) -> None:
        if operation == fcntl.LOCK_EX:  # the launcher's own lock, about to be taken
            swept.extend(sweep_dead_launchers(str(tmp_path)))
        real_flock(file, operation)  # type: ignore[arg-type]

    monkeypatch.setattr(fcntl, "flock", sweep_then_lock)
    with module.launch_folder() as folder:
        assert swept == [] and os.path.isdir(folder), swept
        monkeypatch.setattr(fcntl, "flock", real_flock)
        assert sweep_dead_launchers(str(tmp_path)) == [] and os.path.isdir(folder)
    assert not os.path.exists(folder)


def test_the_jobs_memory_folder_is_private_and_removed(tmp_path: Path) -> None:
    with memory_folder(True, root=str(tmp_path)) as folder:
        assert folder is not None and Path(folder).parent == tmp_path
        assert Path(folder).stat().st_mode & 0o777 == 0o700
        (Path(folder) / "fit1.rank0.0.data").write_bytes(b"step")
    assert not Path(folder).exists()
    with memory_folder(True, root=str(tmp_path / "no-shm")) as none:
        assert none is None  # a node without /dev/shm: restarts resume from storage
