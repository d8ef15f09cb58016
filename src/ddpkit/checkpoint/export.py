"""One-file export: any ddpkit checkpoint as the model's plain weights, loadable without ddpkit.

A ddpkit checkpoint holds more than the weights (optimizer, RNG and loader state) and, under
FSDP or HSDP, is a directory of DCP shards that only ``torch.distributed.checkpoint`` reads.
What serving, evaluation or a Hugging Face ``from_pretrained`` wants is one file of the
model's tensors by name. :func:`export_checkpoint` reads a whole (``.pt``) or sharded
(``.dcp``) checkpoint, from a folder or an object store, checks every checksum on the way
(the content digest of a ``.pt``; every shard file's SHA-256 of a ``.dcp``), gathers the
shards in this one process (no process group, no GPU), and writes the model's state dict:
``torch.save`` of a plain dict (``.pt``), or ``safetensors`` (``.safetensors``, with the
``safetensors`` package). The file is written atomically; its SHA-256 is returned.

Example:
    >>> import tempfile, torch
    >>> from ddpkit.checkpoint.files import save_checkpoint
    >>> runs = tempfile.mkdtemp()
    >>> _ = save_checkpoint({"model": {"w": torch.ones(2)}, "epoch": 1}, runs, epoch=1)
    >>> result = export_checkpoint(runs, f"{runs}/model.pt")
    >>> torch.load(result.path, weights_only=True)
    {'w': tensor([1., 1.])}
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ddpkit._core.atomicfile import atomic_write, fsync_directory
from ddpkit.checkpoint.files import list_checkpoints, parse_name
from ddpkit.checkpoint.integrity import file_digest
from ddpkit.checkpoint.storage import checkpoint_folder, is_url
from ddpkit.errors import CheckpointError, ConfigError

FORMATS = {".pt": "torch", ".pth": "torch", ".bin": "torch", ".safetensors": "safetensors"}


@dataclass(frozen=True)
class ExportResult:
    """What was exported: from which checkpoint, to which file, how many tensors.

    Example:
        >>> ExportResult("runs/x/epoch_000002.pt", Path("m.pt"), 4, 1024, "ab12").tensors
        4
    """

    source: str
    path: Path
    tensors: int
    bytes: int
    sha256: str


def export_checkpoint(source: str | os.PathLike[str], out: str | os.PathLike[str]) -> ExportResult:
    """Write the model weights of checkpoint ``source`` to the one file ``out``.

    ``source`` is a checkpoint (``epoch_000004.pt``, ``epoch_000004.dcp``) or a checkpoint
    folder or URL, whose newest checkpoint is taken. The format follows ``out``'s suffix:
    ``.pt`` / ``.pth`` / ``.bin`` (``torch.save``) or ``.safetensors``. Raises
    :class:`~ddpkit.errors.CheckpointError` for a damaged or missing checkpoint and
    :class:`~ddpkit.errors.ConfigError` for an unknown suffix.

    Example::

        export_checkpoint("runs/gpt", "gpt.safetensors").sha256
    """
    out = Path(out)
    kind = _format_of(out)
    name, weights = _read_model_state(str(source))
    _write(weights, out, kind)
    size = sum(t.numel() * t.element_size() for t in weights.values())
    return ExportResult(name, out, len(weights), size, file_digest(out))


def _format_of(out: Path) -> str:
    kind = FORMATS.get(out.suffix)
    if kind is None:
        raise ConfigError(
            f"export to {out}: the suffix says the format; use one of {', '.join(FORMATS)}"
        )
    return kind


def _read_model_state(source: str) -> tuple[str, dict[str, torch.Tensor]]:
    """(the checkpoint read, its model tensors by name), every checksum checked."""
    if is_url(source):
        return _read_from_store(source)
    path = Path(source.removeprefix("file://"))
    if parse_name(path.name) is None:
        found = list_checkpoints(path)
        if not found:
            raise CheckpointError(f"{path} holds no ddpkit checkpoint (epoch_*.pt or epoch_*.dcp)")
        path = found[-1]
    if path.suffix == ".dcp":
        return str(path), _read_sharded(path)
    return str(path), _model_of(checkpoint_folder(path.parent).read(path.name), str(path))


def _read_from_store(url: str) -> tuple[str, dict[str, torch.Tensor]]:
    base, _, last = url.rstrip("/").rpartition("/")
    if parse_name(last) is not None:
        folder, name = checkpoint_folder(base), last
    else:
        folder = checkpoint_folder(url)
        names = folder.checkpoints()
        if not names:
            raise CheckpointError(f"{url} holds no committed ddpkit checkpoint")
        name = names[-1]
    return folder.location(name), _model_of(folder.read(name), folder.location(name))


def _model_of(state: dict[str, Any], name: str) -> dict[str, torch.Tensor]:
    model = state.get("model")
    if not isinstance(model, dict):
        raise CheckpointError(f"checkpoint {name} has no model state (no 'model' entry)")
    return {k: v for k, v in model.items() if torch.is_tensor(v)}


def _read_sharded(path: Path) -> dict[str, torch.Tensor]:
    """The whole model of a DCP checkpoint, gathered in this process, shards checked first."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    from ddpkit.checkpoint.sharded import SafeFileSystemReader, read_sharded_extra

    read_sharded_extra(path, every_file=True)  # not a rank's share, even in a group
    reader = SafeFileSystemReader(path)
    entries = reader.read_metadata().state_dict_metadata
    model = {
        key.removeprefix("model."): torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in entries.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }
    if not model:
        raise CheckpointError(f"sharded checkpoint {path} has no model tensors")
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp_load({"model": model}, storage_reader=reader, no_dist=True)
    return model


def _write(weights: dict[str, torch.Tensor], out: Path, kind: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if kind == "torch":
        atomic_write(out, lambda handle: torch.save(weights, handle))
        return
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise ConfigError(
            f"export to {out} needs the safetensors package: pip install 'ddpkit[export]' "
            "(or export to a .pt file)"
        ) from None
    # safetensors refuses tensors that share memory (a tied embedding and head): one copy each.
    separate = {name: t.detach().contiguous().clone() for name, t in weights.items()}
    staged = out.with_name(f".{out.name}.tmp")  # beside it: the rename is atomic
    try:
        save_file(separate, str(staged), metadata={"format": "pt"})
        os.replace(staged, out)
    finally:
        staged.unlink(missing_ok=True)
    fsync_directory(out.parent)
