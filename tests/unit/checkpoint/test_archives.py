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
from ddpkit.compiling.cache import CACHE_ENV
from ddpkit.compiling.keptkernels import archive_name, kernels_for_run

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


def _node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Path:
    """A machine's temporary folder (its user cache root below it), a new process there."""
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    node = tmp_path / name
    node.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(node))
    return node


def _store_with_kernels(store: ObjectFolder, tmp_path: Path) -> Path:
    """The store holds this machine's kernels; the folder this node unpacks them into."""
    built = tmp_path / "built"
    built.mkdir()
    (built / "kernel.so").write_bytes(b"the run's own")
    compiled = torch.compile(torch.nn.Linear(2, 2))
    run = kernels_for_run([compiled], None, archive_store(store), torch.device("cpu"))
    assert run is not None and run.folder is not None
    store_archive(store, archive_name(run.folder), built)
    return run.folder


@pytest.mark.parametrize("unsafe", ["group-writable", "world-writable", "another-owner", "link"])
def test_a_kernel_folder_someone_else_could_have_filled_is_never_loaded(
    unsafe: str,
    store: ObjectFolder,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another local user plants kernels where this node would unpack the run's (the
    folder's name is predictable): the run names the folder and compiles without it."""
    import logging
    import os

    _node(tmp_path, monkeypatch, "first")
    planted = _store_with_kernels(store, tmp_path)
    node = _node(tmp_path, monkeypatch, "second")
    target = node / planted.relative_to(tmp_path / "first")  # the same place on this node
    target.parent.mkdir(parents=True, mode=0o700)
    for folder in target.parents:
        if folder == node:
            break
        folder.chmod(0o700)
    if unsafe == "link":
        elsewhere = tmp_path / "attacker"
        elsewhere.mkdir()
        target.symlink_to(elsewhere)
    else:
        target.mkdir(mode=0o700)
        (target / "kernel.so").write_bytes(b"planted")
    if unsafe == "group-writable":
        target.chmod(0o770)
    elif unsafe == "world-writable":
        target.parents[2].chmod(0o777)  # the user's cache root itself
    elif unsafe == "another-owner":
        if os.geteuid() != 0:
            pytest.skip("giving a folder to another user needs root")
        os.chown(target, 65534, 65534)
    with caplog.at_level(logging.WARNING, logger="ddpkit"):
        run = kernels_for_run([torch.compile(torch.nn.Linear(2, 2))], None, archive_store(store),
                              torch.device("cpu"))  # fmt: skip
    assert run is not None and run.folder is None and run.store is None
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "compiled kernels are not kept with the run" in said and "is not private" in said, said
    assert str(target) in said or str(target.parents[2]) in said, said
    chosen = os.environ.get(CACHE_ENV, "")  # torch compiles in its own folder, not the planted one
    assert not chosen.startswith(str(target.parents[2])), chosen


def test_an_unpack_cut_short_is_never_used(
    store: ObjectFolder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash inside the unpack (here: the store fails after writing a file) leaves no
    folder where the kernels go: the next process unpacks the whole archive anew."""
    from ddpkit.checkpoint import archives

    _node(tmp_path, monkeypatch, "first")
    _store_with_kernels(store, tmp_path)
    node = _node(tmp_path, monkeypatch, "second")
    real_fetch = archives.fetch_archive

    def cut_short(source: ObjectFolder, name: str, into: Path) -> int:
        (into / "kernel.so").write_bytes(b"half")
        raise OSError("connection reset while reading the archive")

    monkeypatch.setattr(archives, "fetch_archive", cut_short)
    compiled = torch.compile(torch.nn.Linear(2, 2))
    with pytest.raises(OSError, match="connection reset"):
        kernels_for_run([compiled], None, archive_store(store), torch.device("cpu"))
    halves = [p for p in node.rglob("kernel.so")]
    assert halves == [], halves  # nothing half-unpacked is left to be found
    monkeypatch.setattr(archives, "fetch_archive", real_fetch)
    run = kernels_for_run([compiled], None, archive_store(store), torch.device("cpu"))
    assert run is not None and run.folder is not None
    assert (run.folder / "kernel.so").read_bytes() == b"the run's own"
    assert oct(run.folder.stat().st_mode & 0o777) == "0o700"
