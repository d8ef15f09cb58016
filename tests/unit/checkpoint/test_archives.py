"""A local folder carried in an object store as one archive, and a compiled run's kernels
taken from it on a node that has none (fsspec's in-memory store stands in for S3 here; the
cluster tier runs the same against a real S3 server)."""

from __future__ import annotations

import io
import tarfile
import uuid
from pathlib import Path

import pytest
import torch

from ddpkit.checkpoint.archives import archive_store, fetch_archive, store_archive
from ddpkit.checkpoint.storage import ObjectFolder
from ddpkit.parallel.compilecache import CACHE_ENV
from ddpkit.parallel.compiledrun import archive_name, kernels_for_run

fsspec = pytest.importorskip("fsspec")


@pytest.fixture
def store() -> ObjectFolder:
    return ObjectFolder(f"memory://ddpkit-test/{uuid.uuid4().hex}")


def test_a_folder_comes_back_as_it_was_stored(store: ObjectFolder, tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    (kept / "fxgraph" / "ab").mkdir(parents=True)
    (kept / "fxgraph" / "ab" / "graph").write_bytes(b"\x00kernel")
    (kept / "fingerprint.json").write_text("{}")
    assert store_archive(store, "compile-cache/x.tar.gz", kept) > 0
    back = tmp_path / "back"
    assert fetch_archive(store, "compile-cache/x.tar.gz", back) > 0
    assert (back / "fxgraph" / "ab" / "graph").read_bytes() == b"\x00kernel"
    assert fetch_archive(store, "compile-cache/none.tar.gz", tmp_path / "none") == 0


def test_an_archive_that_reaches_outside_its_folder_is_refused(
    store: ObjectFolder, tmp_path: Path
) -> None:
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as archive:
        member = tarfile.TarInfo("../outside")
        member.size = 4
        archive.addfile(member, io.BytesIO(b"evil"))
    store.fs.pipe(f"{store.root}/bad.tar.gz", packed.getvalue())
    with pytest.raises(tarfile.OutsideDestinationError):
        fetch_archive(store, "bad.tar.gz", tmp_path / "into")
    assert not (tmp_path / "outside").exists()


def test_a_node_without_kernels_unpacks_the_runs(
    store: ObjectFolder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "node-1"))
    compiled = torch.compile(torch.nn.Linear(2, 2))
    first = kernels_for_run([compiled], None, archive_store(store), torch.device("cpu"))
    assert first is not None and first.folder is not None and first.store is not None
    (first.folder / "kernel.so").write_bytes(b"built on node 1")
    store_archive(store, archive_name(first.folder), first.folder)

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "node-2"))  # an empty disk
    monkeypatch.delenv(CACHE_ENV)  # a new process there
    second = kernels_for_run([compiled], None, archive_store(store), torch.device("cpu"))
    assert second is not None and second.folder is not None
    assert second.folder != first.folder and str(second.folder).startswith(str(tmp_path / "node-2"))
    assert (second.folder / "kernel.so").read_bytes() == b"built on node 1"
