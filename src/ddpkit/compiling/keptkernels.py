"""A compiled model's kernels kept with its run's checkpoints, wherever those are, and what
compiling cost its first step.

A checkpoint folder on a file system holds torch's compile cache itself
(:func:`ddpkit.compiling.cache.keep_with_run`). An object store cannot be torch's cache:
there each node compiles into a private folder of this user's (``$XDG_CACHE_HOME/ddpkit``, else
``ddpkit-<uid>`` in the temporary directory: mode 0700, checked to be this user's and
writable by nobody else), named by the store's URL, and the run carries that folder in the
store as one archive per machine fingerprint (``compile-cache/<fingerprint>.tar.gz``). It
is unpacked before the first compile when the store has it, into a folder of its own that
is renamed into place once whole (a crash while unpacking leaves nothing that is used), and
written back by rank 0 after a first step that compiled something new; so a pod recreated
on a node with an empty disk does not compile again what the run compiled. The archive holds
compiled code: keep the bucket writable by the run alone, as its checkpoints.

A kernel folder that is not private (another owner, or writable by others) is never loaded:
the run says so, names it, and compiles without the run's kernels.

Example::

    kernels = kernels_for_run(models, folder.local, archive_store(folder), world.device)
    kernels.first_step_done(world.rank)                                     # after it
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from ddpkit._core.filelock import holding
from ddpkit._core.log import logger
from ddpkit._core.privatefolder import check_private, private_folder, user_cache_root
from ddpkit._core.text import short_digest
from ddpkit.compiling.cache import (
    CACHE_ENV,
    CACHE_FOLDER,
    RAN_EAGERLY,
    any_compiled,
    cache_counts,
    cache_folder,
    captured_graphs,
    compile_summary,
    copy_kernels,
    holds_kernels,
    keep_headers_with,
    keep_used_headers,
    keep_with_run,
    seed_users_cache,
    use_cache_folder,
    user_chose_cache,
)
from ddpkit.errors import UnsafeFolderError


class KernelStore(Protocol):
    """Where an object-store run keeps archives (``ddpkit.checkpoint.archives.ArchiveStore``,
    handed in by the loop: this package does not read checkpoints)."""

    url: str

    def location(self, name: str) -> str:
        """Where archive ``name`` is, for messages."""

    def fetch(self, name: str, into: Path) -> int:
        """Unpack archive ``name`` into ``into``; its bytes, 0 when there is none."""

    def store(self, name: str, folder: Path) -> int:
        """Write ``folder`` as archive ``name``; its bytes."""


@dataclass(frozen=True)
class UsersCache:
    """The user's own ``TORCHINDUCTOR_CACHE_DIR``: seeded from the run's kept kernels when
    it had none (``seeded`` files), and what the run compiles into it (files newer than
    ``since``, wall-clock seconds) kept with the run after the first step.

    Example::

        UsersCache(Path("/scratch/inductor"), seeded=41, since=time.time())
    """

    folder: Path
    seeded: int
    since: float


class CompiledRun:
    """A compiled model's run from its start to its first step: where its kernels are kept
    (``folder``; ``store`` when they travel in an object store), and since when it compiles.

    Example::

        CompiledRun(None, None).first_step_done(rank=0)   # says what the first step cost
    """

    def __init__(
        self, folder: Path | None, store: KernelStore | None, users: UsersCache | None = None
    ) -> None:
        self.folder, self.store, self.users = folder, store, users
        self.started = time.perf_counter()

    def first_step_done(self, rank: int) -> None:
        """Say what compiling cost the first step; the kernels it added are then kept with
        the run (rank 0 carries them to a store)."""
        said = compile_summary(time.perf_counter() - self.started)
        if self.users is not None and self.users.seeded:
            said += (f"; {CACHE_ENV} {self.users.folder} was seeded with {self.users.seeded} "
                     "file(s) of the run's kept kernels")  # fmt: skip
        logger.info(said)
        if captured_graphs() == 0:
            logger.warning(RAN_EAGERLY)
        if self.store is None and self.folder is not None:
            keep_used_headers(self.folder)
            if self.users is not None:  # what this run compiled into the user's folder
                copy_kernels(self.users.folder, self.folder, since=self.users.since)
        if self.store is None or self.folder is None or rank != 0 or cache_counts()[1] == 0:
            return
        name = archive_name(self.folder)
        size = self.store.store(name, self.folder)
        logger.info(f"compiled kernels kept with the run: {self.store.location(name)} "
                    f"({size / 1024:.0f} KB; a resume on any node unpacks them)")  # fmt: skip


def kernels_for_run(
    models: Iterable[nn.Module],
    local: Path | None,
    store: KernelStore | None,
    device: torch.device,
) -> CompiledRun | None:
    """For a compiled model: keep its kernels with the run's checkpoints, in their ``local``
    folder or their object ``store`` (taking those the run kept before), and time its first
    step; None when nothing is compiled.

    Example:
        >>> kernels_for_run([torch.nn.Linear(1, 1)], None, None, torch.device("cpu")) is None
        True
    """
    if not any_compiled(models):
        return None
    try:
        if local is not None:
            return _kept_in(local, device)
        return CompiledRun(_unpacked_from(store, device) if store else None, store)
    except UnsafeFolderError as err:
        logger.warning(f"compiled kernels are not kept with the run: {err}")
        return CompiledRun(None, None)


def _kept_in(local: Path, device: torch.device) -> CompiledRun:
    """The run's kernels kept in ``local``: torch's cache, or beside the user's own."""
    chosen = seed_users_cache(local, device)
    if chosen is not None:
        users, folder, seeded = chosen
        keep_headers_with(folder)
        logger.info(f"compiled kernels: torch's cache is your {CACHE_ENV} {users}; the run "
                    f"keeps its kernels in {folder} too (a resume on a new node is seeded "
                    "from them)")  # fmt: skip
        return CompiledRun(folder, None, UsersCache(users, seeded, time.time()))
    kept = keep_with_run(local, device)
    if kept is not None:
        keep_headers_with(kept)  # (not for a store: 150 MB more in each archive)
        logger.info(f"compiled kernels kept with the run in {kept} (a resume reuses them)")
    return CompiledRun(kept, None)


def archive_name(folder: Path) -> str:
    """The archive of a node's kernel folder in the store: ``compile-cache/<fingerprint>.tar.gz``.

    Example:
        >>> archive_name(Path("/tmp/x/compile-cache/3f0c"))
        'compile-cache/3f0c.tar.gz'
    """
    return f"{CACHE_FOLDER}/{folder.name}.tar.gz"


def _unpacked_from(store: KernelStore, device: torch.device) -> Path | None:
    """This node's private folder for the store's kernels, unpacked from its archive when
    the node has none (one rank per node unpacks; the others wait for it)."""
    if user_chose_cache():  # the user's own TORCHINDUCTOR_CACHE_DIR
        return None
    root = private_folder(user_cache_root() / "compile-cache")
    folder = cache_folder(root / short_digest(store.url), device)
    private_folder(folder.parent)
    with holding(folder.parent / f".{folder.name}.lock"):
        if os.path.lexists(folder):  # only ever renamed into place whole
            check_private(folder)
            if holds_kernels(folder):
                use_cache_folder(folder, device)
                logger.info(f"compiled kernels of the run already on this node in {folder}")
                return folder
            shutil.rmtree(folder)  # nothing compiled here yet: the store may have some now
        size = _unpack_whole(store, archive_name(folder), folder)
    use_cache_folder(folder, device)
    where = store.location(archive_name(folder))
    logger.info(
        f"compiled kernels of the run: {size / 1024:.0f} KB from {where}, in {folder}"
        if size
        else f"no compiled kernels in {where} yet for this machine: compiling, then kept there"
    )
    return folder


def _unpack_whole(store: KernelStore, name: str, folder: Path) -> int:
    """Archive ``name`` unpacked into a fresh private folder beside ``folder``, renamed to it
    once whole; its bytes (0: none in the store, an empty folder made all the same)."""
    partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}.unpacking-", dir=folder.parent))
    try:
        size = store.fetch(name, partial)
        partial.rename(folder)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return size
