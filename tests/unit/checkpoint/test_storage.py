"""The checkpoint folder's kinds: which a checkpoint_dir picks, and what an object store refuses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ddpkit.checkpoint import resolve_checkpoint_dir
from ddpkit.checkpoint.storage import LocalFolder, ObjectFolder, checkpoint_folder, is_url, prune
from ddpkit.errors import ConfigError
from ddpkit.train.checkpointer import Checkpointer
from ddpkit.train.options import CheckpointOptions


def test_a_path_is_a_local_folder_and_a_url_an_object_store() -> None:
    pytest.importorskip("s3fs")
    assert isinstance(checkpoint_folder("runs/x"), LocalFolder)
    assert isinstance(checkpoint_folder("file:///tmp/x"), LocalFolder)
    assert checkpoint_folder("file:///tmp/x").location("a.pt") == "/tmp/x/a.pt"
    store = checkpoint_folder("s3://bucket/runs/x/")
    assert isinstance(store, ObjectFolder) and store.local is None
    assert store.location("epoch_000001.pt") == "s3://bucket/runs/x/epoch_000001.pt"
    assert not is_url("C:/runs") and not is_url("runs/s3://odd") and is_url("gs://b/x")


def test_an_unknown_scheme_names_what_to_install() -> None:
    with pytest.raises(ConfigError, match=r"checkpoint_dir nosuch://b/x: fsspec cannot open it"):
        checkpoint_folder("nosuch://b/x")


def test_a_url_is_kept_unless_a_ddpkit_command_redirects_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert resolve_checkpoint_dir("s3://bucket/run") == "s3://bucket/run"
    monkeypatch.setenv("DDPKIT_CHECKPOINT_DIR", "/tmp/verify-1/checkpoints")
    assert resolve_checkpoint_dir("s3://bucket/run") == Path(
        "/tmp/verify-1/checkpoints/s3:-bucket-run"
    )


def test_sharded_checkpoints_in_an_object_store_are_refused_before_training() -> None:
    pytest.importorskip("s3fs")
    checkpointer = Checkpointer(CheckpointOptions("s3://bucket/run"))
    with pytest.raises(ConfigError, match=r"s3://bucket/run is an object store, and FSDP's shard"):
        checkpointer._local()


def test_local_prune_keeps_the_newest(tmp_path: Path) -> None:
    folder = checkpoint_folder(tmp_path)
    for name in ("epoch_000001.pt", "epoch_000002_step_000009.pt", "epoch_000002.pt"):
        folder.write(name, {"w": torch.zeros(1)})
    assert prune(folder, keep=1) == ["epoch_000001.pt", "epoch_000002_step_000009.pt"]
    assert os.listdir(tmp_path) == ["epoch_000002.pt"]
    with pytest.raises(ConfigError, match="keep must be >= 1"):
        prune(folder, keep=0)
