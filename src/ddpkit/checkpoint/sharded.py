"""Sharded checkpoints for FSDP models, written and read with torch.distributed.checkpoint (DCP).

Every rank writes its own shards in parallel into one directory named by position
(``epoch_000004.dcp``, ``epoch_000005_step_000412.dcp``); no rank ever holds the whole model.
The directory is written under a temporary name and renamed by rank 0 once DCP has written
its metadata (DCP fsyncs every file), so a crash mid-write leaves the previous checkpoint
untouched. DCP reshards on load: a checkpoint saved by 4 ranks loads into 2. Non-tensor
training state (epoch, metrics, scheduler) sits beside the shards in ``trainer.pt``, loaded
with ``weights_only=True``, together with the SHA-256 of every shard file: on resume each
rank checks its share of the files, so a damaged checkpoint is found before loading. DCP's
own ``.metadata`` file is a pickle; ddpkit reads it with an unpickler that admits only DCP's
metadata classes, so a tampered checkpoint cannot run code.

Written in the background (:func:`start_sharded_save`, DCP's asynchronous save), training
stops only while each rank copies its shards to CPU memory; the shards, their digests and the
rename follow in a thread, with the same temporary directory and the same rename, so what a
crash leaves is the same as for a synchronous save.

Example:
    >>> sharded_name(3)
    'epoch_000003.dcp'
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import shutil
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ddpkit._core.atomicfile import fsync_directory
from ddpkit.checkpoint.background import snapshot
from ddpkit.checkpoint.files import (
    Position,
    load_checkpoint,
    remove_path,
    save_sealed,
)
from ddpkit.checkpoint.integrity import file_digest
from ddpkit.errors import CheckpointError
from ddpkit.runtime.collectives import all_gather_rows, barrier, get_rank, is_main
from ddpkit.runtime.tensortree import tensor_bytes
from ddpkit.runtime.watchdog import watch

TRAINER_FILE = "trainer.pt"
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_SAFE_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


def sharded_name(epoch: int, step: int | None = None) -> str:
    """Directory name of the sharded checkpoint at the end of ``epoch`` (or at ``step``).

    Example:
        >>> sharded_name(12)
        'epoch_000012.dcp'
    """
    return Position(epoch, step).name(".dcp")


def save_sharded(
    model: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    extra: dict[str, Any],
    folder: str | os.PathLike[str],
    position: Position,
) -> Path:
    """Collective: every rank writes its shards; returns the checkpoint directory.

    Every optimizer in ``optimizers`` is saved (DCP keys their state by parameter name).
    ``extra`` (plain training state) goes into ``trainer.pt`` with the SHA-256 of every
    shard file, each rank hashing its share of the files.

    Example::

        save_sharded(model, [opt], {"epoch": 2}, "runs/x", Position(2))
        # PosixPath('runs/x/epoch_000002.dcp')
    """
    staging, final = _staging(Path(folder), position)
    with _dcp_call(f"saving the sharded checkpoint {final.name}"):
        dcp_save(_dcp_state(model, optimizers), checkpoint_id=staging)
    barrier()  # every shard and DCP's metadata are on disk
    _publish(staging, final, extra, _shard_digests(staging, all_gather_rows))
    barrier()
    return final


def start_sharded_save(
    model: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    extra: dict[str, Any],
    folder: str | os.PathLike[str],
    position: Position,
) -> Callable[[], Path]:
    """Collective: copy this rank's shards to CPU memory and start DCP's asynchronous save;
    returns what completes it, to run in a background thread on every rank (it waits for
    the shards, hashes this rank's share of the files, and rank 0 publishes the directory
    as :func:`save_sharded` does). ``extra`` is copied here (:func:`snapshot`), so training
    may change it once this returns.

    The background collectives (DCP's plan and the digests) go through a gloo group of
    their own, so they never interleave with the training's collectives.

    Example::

        complete = start_sharded_save(model, [opt], extra, "runs/x", Position(2))
        threading.Thread(target=complete).start()   # training goes on
    """
    extra = snapshot(extra)  # what the write holds, whatever training does meanwhile
    staging, final = _staging(Path(folder), position)
    group = _background_group()
    with _dcp_call(f"copying the sharded checkpoint {final.name} for its background write"):
        pending = dcp_async_save(
            _dcp_state(model, optimizers), checkpoint_id=staging, process_group=group
        )

    # Newer torch answers with an AsyncSaveResponse (staging, then upload); older a Future.
    upload = cast(Future[Any], getattr(pending, "upload_completion", pending))

    def complete() -> Path:
        upload.result()  # every rank's shards and DCP's metadata are on disk
        _publish(staging, final, extra, _shard_digests(staging, partial(_gather_in, group)))
        return final

    return complete


def shard_bytes(model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> int:
    """The bytes of this rank's shards of the model and optimizer state: what an
    asynchronous save copies to CPU memory.

    Example::

        shard_bytes(fsdp_model, [optimizer]) / 2**20   # MB on this rank
    """
    return tensor_bytes(_dcp_state(model, optimizers))


def _staging(folder: Path, position: Position) -> tuple[Path, Path]:
    """Collective: the empty temporary directory shards are written into, and the final one."""
    final = folder / position.name(".dcp")
    staging = folder / f".{final.name}.tmp"
    if is_main():
        shutil.rmtree(staging, ignore_errors=True)  # left by a run that died mid-write
        staging.mkdir(parents=True)
    barrier()
    return staging, final


def _dcp_state(model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> dict[str, Any]:
    model_state, optim_state = get_state_dict(model, list(optimizers))
    return {"model": model_state, "optimizer": optim_state}


def _publish(staging: Path, final: Path, extra: dict[str, Any], digests: dict[str, str]) -> None:
    """Rank 0 seals the training state with the shards' digests and renames the directory."""
    if is_main():
        save_sealed({**extra, "files": digests}, staging / TRAINER_FILE)
        remove_path(final)  # the same position saved again
        os.replace(staging, final)
        fsync_directory(final.parent)


def read_sharded_extra(path: str | os.PathLike[str], *, every_file: bool = False) -> dict[str, Any]:
    """This rank's check of a sharded checkpoint: ``trainer.pt`` and this rank's share of
    the shard files against their digests (all of them with ``every_file``, for one process
    that reads the whole checkpoint, in a process group or not). No collective, so a rank
    that finds damage can say so without leaving the others waiting; the training state is
    returned.

    Example::

        read_sharded_extra("runs/x/epoch_000002.dcp")["epoch"]   # 2
    """
    path = Path(path)
    extra = load_checkpoint(path / TRAINER_FILE)
    recorded = extra.get("files") or {}
    names = sorted(recorded)
    for name in names if every_file else names[get_rank() :: _world_size()]:
        _check_shard_file(path, name, recorded[name])
    return extra


def _check_shard_file(path: Path, name: str, recorded: str) -> None:
    actual = file_digest(path / name) if (path / name).is_file() else "missing"
    if actual != recorded:
        raise CheckpointError(
            f"sharded checkpoint {path} is damaged: {name} "
            + ("is missing" if actual == "missing" else "does not match its checksum")
            + " (a damaged disk or a partial copy); restore it from a copy, or use an earlier "
            "checkpoint"
        )


def load_sharded(
    model: nn.Module, optimizers: Sequence[torch.optim.Optimizer], path: str | os.PathLike[str]
) -> None:
    """Collective: load the shards of ``path`` into ``model`` and every one of ``optimizers``.

    Example::

        load_sharded(fsdp_model, [optimizer], "runs/x/epoch_000002.dcp")
    """
    optimizers = list(optimizers)
    path = Path(path)
    with _dcp_call(f"loading the sharded checkpoint {path.name}"):
        model_state, optim_state = get_state_dict(model, optimizers)  # templates to load into
        state: dict[str, Any] = {"model": model_state, "optimizer": optim_state}
        try:
            dcp_load(state, storage_reader=SafeFileSystemReader(path))
        except (RuntimeError, ValueError, KeyError, pickle.UnpicklingError) as err:
            raise CheckpointError(
                f"sharded checkpoint {path} does not match this model/optimizer or is damaged: "
                f"{str(err).strip()[:500]}"
            ) from err
        set_state_dict(
            model, optimizers, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )


def _shard_digests(
    folder: Path, gather: Callable[[torch.Tensor], list[torch.Tensor]]
) -> dict[str, str]:
    """SHA-256 of every file DCP wrote, the hashing shared out over the ranks: ``gather``
    (a collective) brings every rank's rows of 32 digest bytes, padded to the same count."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != TRAINER_FILE)
    world_size = _world_size()
    mine = [bytes.fromhex(file_digest(folder / n)) for n in names[get_rank() :: world_size]]
    rows = torch.zeros((len(names[::world_size]), 32), dtype=torch.uint8)
    rows[: len(mine)] = torch.tensor([list(d) for d in mine], dtype=torch.uint8).reshape(-1, 32)
    digests = {}
    for rank, block in enumerate(gather(rows)):
        for index, row in enumerate(block[: len(names[rank::world_size])]):
            digests[names[rank + index * world_size]] = bytes(row.tolist()).hex()
    return digests


def _gather_in(group: dist.ProcessGroup, rows: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``rows`` (the same shape on every rank) through ``group``."""
    gathered = [torch.empty_like(rows) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, rows, group=group)
    return gathered


_background: tuple[Any, dist.ProcessGroup] | None = None  # (the default group, its twin)


def _background_group() -> dist.ProcessGroup:
    """Collective the first time in a process group: a gloo group of every rank for the
    collectives of background writes (a new one after the default group is replaced)."""
    global _background
    default = dist.distributed_c10d._get_default_group()
    if _background is None or _background[0] is not default:
        _background = (default, dist.new_group(backend="gloo"))
    return _background[1]


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader, with its metadata unpickled through an allow-list.

    Example::

        reader = SafeFileSystemReader("runs/x/epoch_000002.dcp")
    """

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / ".metadata"
        try:
            metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
        except FileNotFoundError:
            raise CheckpointError(f"{path} is missing: not a complete sharded checkpoint") from None
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path} does not hold DCP metadata")
        metadata.storage_meta = metadata.storage_meta or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        dtype = getattr(torch, name, None) if module == "torch" else None
        allowed = (
            (module, name) in _SAFE_GLOBALS
            or isinstance(dtype, torch.dtype)
            or (module == _METADATA_MODULE and not name.startswith("__"))
        )
        if not allowed:
            raise pickle.UnpicklingError(
                f"refusing to load {module}.{name} from checkpoint metadata: only DCP metadata "
                "classes are allowed (the file may have been tampered with)"
            )
        return super().find_class(module, name)


@contextlib.contextmanager
def _dcp_call(label: str) -> Iterator[None]:
    """A DCP call: its collectives are timed by the hang watchdog, and its one-process
    warning is silenced."""
    # Without a process group DCP warns that it assumes one process; in a world of one
    # (loading an FSDP checkpoint for evaluation, say) that is exactly the intent.
    with watch(label), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
