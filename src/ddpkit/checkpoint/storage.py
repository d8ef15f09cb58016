"""Where a run keeps its checkpoints: a folder on a file system, or an object store by URL.

The :class:`~ddpkit.train.checkpointer.Checkpointer` sees one interface, :class:`CheckpointFolder`,
over checkpoint names (``epoch_000004.pt``): list the complete ones, write one atomically,
read one with its checksum checked, remove, set aside (quarantine) and clean up after a
crashed write. :func:`checkpoint_folder` picks the kind from ``checkpoint_dir``:

* a path (local disk, or a shared POSIX file system such as NFS or Lustre):
  :class:`LocalFolder`, a temporary file renamed over the final name;
* a URL (``s3://bucket/prefix``, ``gs://...``, ``az://...``, anything fsspec opens):
  :class:`ObjectFolder`. Object stores have no rename, so a checkpoint is written under its
  final key and then committed by a small marker object beside it (``epoch_000004.pt.commit``);
  only committed checkpoints are listed, so a write cut short (a ``kill -9``, a lost host)
  is never taken as the newest. Removal takes the marker first, for the same reason.

Example:
    >>> import tempfile, torch
    >>> folder = checkpoint_folder(tempfile.mkdtemp())
    >>> folder.write("epoch_000001.pt", {"epoch": 1, "w": torch.zeros(1)})
    >>> folder.checkpoints(), folder.read("epoch_000001.pt")["epoch"]
    (['epoch_000001.pt'], 1)
"""

from __future__ import annotations

import io
import json
import os
import posixpath
from pathlib import Path
from typing import Any, Protocol

import torch

from ddpkit.checkpoint.files import (
    INVALID_SUFFIX,
    list_checkpoints,
    load_checkpoint,
    parse_name,
    quarantine,
    remove_path,
    remove_stale_temporaries,
    save_sealed,
)
from ddpkit.checkpoint.integrity import seal
from ddpkit.errors import CheckpointError, ConfigError

COMMIT_SUFFIX = ".commit"  # the marker that makes an object-store checkpoint complete


def is_url(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` names an object store (``s3://...``) rather than a path.

    Example:
        >>> is_url("s3://bucket/runs"), is_url("runs/wine"), is_url("file:///tmp/x")
        (True, False, False)
    """
    scheme, found, _ = str(folder).partition("://")
    return bool(found) and scheme != "file" and "/" not in scheme


class CheckpointFolder(Protocol):
    """A run's checkpoints by name, wherever they are kept."""

    local: Path | None  # the folder on a file system; None for an object store

    def location(self, name: str) -> str:
        """Where checkpoint ``name`` is, for messages and for loading by hand."""

    def checkpoints(self) -> list[str]:
        """The complete checkpoints' names, oldest position first."""

    def write(self, name: str, state: dict[str, Any]) -> None:
        """Seal ``state`` with its digest and store it as ``name``, all or nothing."""

    def read(self, name: str, map_location: Any = "cpu") -> dict[str, Any]:
        """Load checkpoint ``name`` safely and check its digest (CheckpointError if not)."""

    def remove(self, name: str) -> None:
        """Delete checkpoint ``name``; nothing if it is not there."""

    def quarantine(self, name: str) -> str:
        """Keep a checkpoint that failed its checks, never to be resumed from; its new name."""

    def clean(self) -> list[str]:
        """Remove what writes cut short left behind (only while nothing is being written)."""


def checkpoint_folder(folder: str | os.PathLike[str]) -> CheckpointFolder:
    """The checkpoints in ``folder``: a path or an object-store URL.

    Example:
        >>> checkpoint_folder("runs/wine").location("epoch_000002.pt")
        'runs/wine/epoch_000002.pt'
    """
    path = local_path(folder)
    return ObjectFolder(str(folder)) if path is None else LocalFolder(path)


def local_path(folder: str | os.PathLike[str]) -> Path | None:
    """The folder on a file system that ``folder`` names (``file://`` stripped: this disk,
    not an object store); None for an object-store URL.

    Example:
        >>> local_path("file:///runs/wine"), local_path("runs/wine"), local_path("s3://b/run")
        (PosixPath('/runs/wine'), PosixPath('runs/wine'), None)
    """
    return None if is_url(folder) else Path(str(folder).removeprefix("file://"))


def prune(folder: CheckpointFolder, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` checkpoints of ``folder``; what was deleted.

    Example:
        >>> import tempfile
        >>> folder = checkpoint_folder(tempfile.mkdtemp())
        >>> for epoch in (1, 2, 3):
        ...     folder.write(f"epoch_00000{epoch}.pt", {"epoch": epoch})
        >>> prune(folder, keep=2)
        ['epoch_000001.pt']
    """
    if keep < 1:
        raise ConfigError(f"keep must be >= 1 (got {keep})")
    doomed = folder.checkpoints()[:-keep]
    for name in doomed:
        folder.remove(name)
    return doomed


class LocalFolder:
    """Checkpoints in a folder on a file system (see :mod:`ddpkit.checkpoint.files`).

    Example:
        >>> LocalFolder(Path("runs/x")).location("epoch_000001.pt")
        'runs/x/epoch_000001.pt'
    """

    def __init__(self, path: Path) -> None:
        self.local: Path | None = path
        self.path = path

    def __repr__(self) -> str:
        return f"LocalFolder({str(self.path)!r})"

    def location(self, name: str) -> str:
        return str(self.path / name)

    def checkpoints(self) -> list[str]:
        return [p.name for p in list_checkpoints(self.path)]

    def write(self, name: str, state: dict[str, Any]) -> None:
        save_sealed(state, self.path / name)

    def read(self, name: str, map_location: Any = "cpu") -> dict[str, Any]:
        return load_checkpoint(self.path / name, map_location=map_location)

    def remove(self, name: str) -> None:
        remove_path(self.path / name)

    def quarantine(self, name: str) -> str:
        path = self.path / name
        return quarantine(path).name if path.exists() else name + INVALID_SUFFIX

    def clean(self) -> list[str]:
        return [p.name for p in remove_stale_temporaries(self.path)]


class ObjectFolder:
    """Checkpoints under a URL prefix in an object store, through fsspec (``s3fs`` for
    ``s3://``, ``gcsfs`` for ``gs://``, ``adlfs`` for ``az://``).

    Example::

        folder = ObjectFolder("s3://my-bucket/runs/wine")
        folder.checkpoints()            # ['epoch_000002.pt', 'epoch_000004.pt']
    """

    def __init__(self, url: str) -> None:
        self.local: Path | None = None
        self.url = url.rstrip("/")
        self.fs, self.root = _filesystem(self.url)

    def __repr__(self) -> str:
        return f"ObjectFolder({self.url!r})"

    def location(self, name: str) -> str:
        return f"{self.url}/{name}"

    def checkpoints(self) -> list[str]:
        keys = self._names()
        done = [n for n in keys if parse_name(n) and n + COMMIT_SUFFIX in keys]
        return sorted(done, key=lambda n: _position_key(n))

    def write(self, name: str, state: dict[str, Any]) -> None:
        sealed = seal(state)
        with self.fs.open(self._key(name), "wb") as handle:
            torch.save(sealed, handle)
        size = self.fs.size(self._key(name))
        self.fs.pipe(self._key(name + COMMIT_SUFFIX), json.dumps({"bytes": size}).encode())

    def read(self, name: str, map_location: Any = "cpu") -> dict[str, Any]:
        try:
            with self.fs.open(self._key(name), "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint {self.location(name)} does not exist") from None
        return load_checkpoint(io.BytesIO(data), map_location, name=self.location(name))

    def remove(self, name: str) -> None:
        for key in (self._key(name + COMMIT_SUFFIX), self._key(name)):  # the marker first
            if self.fs.exists(key):
                self.fs.rm(key)

    def quarantine(self, name: str) -> str:
        target = name + INVALID_SUFFIX
        if self.fs.exists(self._key(name + COMMIT_SUFFIX)):
            self.fs.rm(self._key(name + COMMIT_SUFFIX))
        if self.fs.exists(self._key(name)):
            self.fs.mv(self._key(name), self._key(target))
        return target

    def clean(self) -> list[str]:
        keys = self._names()
        cut_short = [n for n in keys if parse_name(n) and n + COMMIT_SUFFIX not in keys]
        for name in cut_short:
            self.fs.rm(self._key(name))
        return cut_short

    def _key(self, name: str) -> str:
        return posixpath.join(self.root, name)

    def _names(self) -> set[str]:
        self.fs.invalidate_cache(self.root)  # another host may have written since
        try:
            found = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return set()
        return {posixpath.basename(str(key).rstrip("/")) for key in found}


def _position_key(name: str) -> tuple[int, float]:
    position = parse_name(name)
    assert position is not None
    return position._key()


def _filesystem(url: str) -> tuple[Any, str]:
    """fsspec's file system for ``url`` and the path within it; a clear error without it."""
    try:
        import fsspec
    except ImportError:
        raise ConfigError(
            f"checkpoint_dir {url} is a URL, which needs fsspec: pip install fsspec"
        ) from None
    try:
        return fsspec.core.url_to_fs(url)  # type: ignore[no-any-return]
    except (ImportError, ValueError) as err:
        raise ConfigError(
            f"checkpoint_dir {url}: fsspec cannot open it ({err}); for s3:// install "
            "ddpkit[s3] (s3fs), for gs:// gcsfs, for az:// adlfs"
        ) from None
