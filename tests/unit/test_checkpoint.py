"""Atomic writes, newest-first discovery and safe loading (no processes)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ddpkit import CheckpointError
from ddpkit.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint


def test_save_leaves_only_the_final_file(tmp_path: Path) -> None:
    path = save_checkpoint({"epoch": 1, "w": torch.ones(3)}, tmp_path, epoch=1)
    assert sorted(os.listdir(tmp_path)) == ["epoch_000001.pt"]
    assert torch.equal(load_checkpoint(path)["w"], torch.ones(3))


def test_latest_is_the_highest_epoch_not_the_newest_name(tmp_path: Path) -> None:
    for epoch in (2, 10, 9):
        save_checkpoint({"epoch": epoch}, tmp_path, epoch=epoch)
    (tmp_path / ".epoch_000011.pt.abc.tmp").write_bytes(b"half-written")
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "epoch_000002.pt",
        "epoch_000009.pt",
        "epoch_000010.pt",
    ]
    assert load_checkpoint(latest_checkpoint(tmp_path))["epoch"] == 10  # type: ignore[arg-type]


def test_failed_write_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    save_checkpoint({"epoch": 1, "w": torch.zeros(2)}, tmp_path, epoch=1)

    class Unsaveable:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint({"epoch": 2, "bad": Unsaveable()}, tmp_path, epoch=2)
    assert sorted(os.listdir(tmp_path)) == ["epoch_000001.pt"]  # no torn file, no temp file


def test_truncated_file_is_reported_not_loaded(tmp_path: Path) -> None:
    path = save_checkpoint({"w": torch.randn(100)}, tmp_path, epoch=1)
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(CheckpointError, match="could not be loaded safely"):
        load_checkpoint(path)


class Payload:
    """An arbitrary object: weights_only loading must refuse to unpickle it."""


def test_pickled_objects_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "epoch_000001.pt"
    torch.save({"evil": Payload()}, path)
    with pytest.raises(CheckpointError, match="hold objects other than tensors"):
        load_checkpoint(path)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "epoch_000001.pt")
