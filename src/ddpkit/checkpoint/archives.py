"""A local folder carried in a run's object store as one ``.tar.gz``: what cannot live there
as files (torch's compile cache must be a folder on this machine) travels with the run.

Example::

    store = ObjectFolder("s3://bucket/runs/gpt")
    fetch_archive(store, "compile-cache/3f0c.tar.gz", Path("/tmp/kernels"))   # bytes, or 0
    store_archive(store, "compile-cache/3f0c.tar.gz", Path("/tmp/kernels"))
"""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
import tempfile
from pathlib import Path

from ddpkit.checkpoint.storage import CheckpointFolder, ObjectFolder


class ArchiveStore:
    """A run's object store as a keeper of archives (what ``compiling.keptkernels`` takes).

    Example::

        ArchiveStore(ObjectFolder("s3://bucket/run")).fetch("compile-cache/3f.tar.gz", here)
    """

    def __init__(self, folder: ObjectFolder) -> None:
        self.folder, self.url = folder, folder.url

    def location(self, name: str) -> str:
        return self.folder.location(name)

    def fetch(self, name: str, into: Path) -> int:
        return fetch_archive(self.folder, name, into)

    def store(self, name: str, folder: Path) -> int:
        return store_archive(self.folder, name, folder)


def archive_store(folder: CheckpointFolder | None) -> ArchiveStore | None:
    """The archives of a run whose checkpoints are in an object store; None otherwise.

    Example:
        >>> archive_store(None) is None
        True
    """
    return ArchiveStore(folder) if isinstance(folder, ObjectFolder) else None


def fetch_archive(store: ObjectFolder, name: str, into: Path) -> int:
    """Unpack archive ``name`` of ``store`` into the folder ``into`` (made if needed); its
    size in bytes, 0 when the store has none. Members that would land outside ``into``
    (absolute paths, ``..``, links out) are refused, as tarfile's ``data`` filter does.

    Example::

        fetch_archive(store, "compile-cache/3f0c.tar.gz", Path("/tmp/kernels"))   # 547123
    """
    key = posixpath.join(store.root, name)
    try:
        data = store.fs.cat_file(key)
    except FileNotFoundError:
        return 0
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        archive.extractall(into, filter="data")
    return len(data)


def store_archive(store: ObjectFolder, name: str, folder: Path) -> int:
    """Write ``folder``'s files as archive ``name`` of ``store``, in one object (a reader sees
    the old archive or the new one, never a part); its size in bytes.

    Example::

        store_archive(store, "compile-cache/3f0c.tar.gz", Path("/tmp/kernels"))   # 547123
    """
    with tempfile.TemporaryDirectory(prefix="ddpkit-archive-") as scratch:
        packed = Path(scratch) / "folder.tar.gz"
        with tarfile.open(packed, "w:gz") as archive:
            for entry in sorted(os.listdir(folder)):
                archive.add(folder / entry, arcname=entry)
        store.fs.put_file(str(packed), posixpath.join(store.root, name))
        return packed.stat().st_size
