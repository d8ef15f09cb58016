"""Atomic writes, positions, checksums, pruning and safe loading (no processes)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ddpkit import CheckpointError, DdpkitError
from ddpkit.checkpoint.files import (
    Position,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    parse_name,
    prune_checkpoints,
    quarantine,
    remove_stale_temporaries,
    save_checkpoint,
)


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


def test_positions_sort_epoch_ends_after_the_steps_inside_them(tmp_path: Path) -> None:
    for epoch, step in ((5, None), (6, 412), (6, None), (6, 400), (10, None), (7, 450)):
        save_checkpoint({"epoch": epoch}, tmp_path, epoch=epoch, step=step)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "epoch_000005.pt",
        "epoch_000006_step_000400.pt",
        "epoch_000006_step_000412.pt",
        "epoch_000006.pt",
        "epoch_000007_step_000450.pt",
        "epoch_000010.pt",
    ]
    assert parse_name("epoch_000006_step_000412.pt") == Position(6, 412)


def test_a_flipped_byte_inside_a_tensor_is_caught_by_the_checksum(tmp_path: Path) -> None:
    path = save_checkpoint({"w": torch.zeros(4096)}, tmp_path, epoch=1)
    data = bytearray(path.read_bytes())
    offset = data.index(bytes(64))  # inside the zero tensor's bytes, not the zip headers
    data[offset + 10] = 0x3F
    path.write_bytes(bytes(data))
    assert torch.load(path, weights_only=True)["w"].abs().sum() > 0  # torch loads it happily
    with pytest.raises(CheckpointError, match="is corrupted: its contents do not match"):
        load_checkpoint(path)


def test_prune_keeps_the_newest_and_quarantine_sets_aside(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        save_checkpoint({"step": step}, tmp_path, epoch=1, step=step)
    removed = prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in removed] == [
        "epoch_000001_step_000010.pt",
        "epoch_000001_step_000020.pt",
    ]
    newest = latest_checkpoint(tmp_path)
    assert newest is not None and quarantine(newest).name == "epoch_000001_step_000040.pt.invalid"
    assert latest_checkpoint(tmp_path).name == "epoch_000001_step_000030.pt"  # type: ignore[union-attr]


def test_stale_temporaries_are_removed_and_never_listed(tmp_path: Path) -> None:
    save_checkpoint({"epoch": 1}, tmp_path, epoch=1)
    (tmp_path / ".epoch_000002.pt.k3j.tmp").write_bytes(b"half a checkpoint")
    (tmp_path / ".epoch_000002.dcp.tmp").mkdir()  # a sharded write that never finished
    assert [p.name for p in list_checkpoints(tmp_path)] == ["epoch_000001.pt"]
    assert len(remove_stale_temporaries(tmp_path)) == 2
    assert sorted(os.listdir(tmp_path)) == ["epoch_000001.pt"]


class CodeRunner:
    """Unpickling this would run a command: the classic pickle payload."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_payload_is_refused_without_running(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    path = tmp_path / "epoch_000001.pt"
    torch.save({"model": {}, "payload": CodeRunner(marker)}, path)
    with pytest.raises(CheckpointError, match="weights_only loading refuses to run"):
        load_checkpoint(path)
    assert not marker.exists()


class MyScheduleState:
    """A user's own class inside a checkpoint: loadable once allowed by name."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup


def test_own_classes_load_after_the_documented_opt_in(tmp_path: Path) -> None:
    path = save_checkpoint({"schedule": MyScheduleState(5)}, tmp_path, epoch=1)
    with pytest.raises(CheckpointError, match="add_safe_globals"):
        load_checkpoint(path)
    with torch.serialization.safe_globals([MyScheduleState]):  # scoped add_safe_globals
        assert load_checkpoint(path)["schedule"].warmup == 5


def test_prune_refuses_keeping_none_with_ddpkits_error(tmp_path: Path) -> None:
    with pytest.raises(DdpkitError, match="keep must be >= 1 \\(got 0\\)"):
        prune_checkpoints(tmp_path, keep=0)
