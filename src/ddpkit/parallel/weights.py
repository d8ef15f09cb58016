"""Weights from a file, and models that start on the meta device.

Building a large model on every rank before FSDP shards it costs every rank the whole model:
the memory sharding exists to save. Built under ``torch.device("meta")`` instead, the model
has shapes and no storage; ``prepare_model(model, "fsdp", weights=PATH)`` shards it while it
is still empty, gives each rank storage for its shards only (``to_empty``), and reads into
them just the rows of each weight that rank holds. From a ``.safetensors`` file those rows
are read with plain file reads straight into the shard, so a rank's memory grows by its
shards and nothing more (:mod:`ddpkit.parallel.weightfiles`); from a ``.pt`` file, one
memory-mapped tensor at a time. Under DDP the model is given its storage first and loaded
whole, as DDP holds it whole; tied parameters stay tied.

``weights`` is a ``.safetensors`` file, a ``.pt`` / ``.pth`` / ``.bin`` state dict (read with
``weights_only=True``), or a folder holding one of them or the shards of a Hugging Face
checkpoint (``model.safetensors.index.json`` or ``*.safetensors``). Every tensor of the
model must be in it, with its shape; a tensor the model lacks is named in a warning. A
model that is not on the meta device can take ``weights=`` too: it is loaded the same way
after wrapping.

Example:
    >>> import torch
    >>> with torch.device("meta"):
    ...     net = torch.nn.Linear(2, 2)
    >>> on_meta(net), on_meta(torch.nn.Linear(2, 2))
    (True, False)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from ddpkit._core.log import logger
from ddpkit.errors import ConfigError
from ddpkit.parallel.shards import is_sharded
from ddpkit.parallel.weightfiles import WeightFile


def on_meta(model: nn.Module) -> bool:
    """True when any parameter or buffer of ``model`` is on the meta device (has no values).

    Example:
        >>> on_meta(torch.nn.Linear(1, 1))
        False
    """
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def check_start(model: nn.Module, weights: str | os.PathLike[str] | None) -> bool:
    """Whether ``model`` starts on the meta device; a ConfigError when it cannot be filled.

    Example:
        >>> check_start(torch.nn.Linear(1, 1), None)
        False
    """
    if not on_meta(model):
        return False
    if weights is None:
        raise ConfigError(
            "the model is on the meta device (built under torch.device('meta')): it has "
            "shapes but no values. Pass the weights to load into it, "
            "prepare_model(model, ..., weights='model.safetensors'), or build it on a device"
        )
    unsaved = [name for name, buffer in _unsaved_buffers(model) if buffer.is_meta]
    if unsaved:
        raise ConfigError(
            f"buffer(s) {', '.join(unsaved[:5])} are on the meta device and not saved in a "
            "state dict (persistent=False), so no weights file can fill them: create them "
            "after prepare_model, or register them with persistent=True"
        )
    return True


def fill(model: nn.Module, weights: str | os.PathLike[str], device: torch.device) -> None:
    """Give a model still on the meta device its storage on ``device`` (each rank its shards
    when sharded), then load ``weights`` into it.

    Example::

        fill(unwrap(sharded), "gpt.safetensors", torch.device("cuda", 0))
    """
    if on_meta(model):
        materialize(model, device)
    load_weights(model, weights)


def materialize(model: nn.Module, device: torch.device) -> None:
    """``model.to_empty(device)`` with tied parameters kept tied: ``to_empty`` makes a new
    parameter per module, and a tied embedding and head would train apart.

    Example:
        >>> with torch.device("meta"):
        ...     net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        >>> net[1].weight = net[0].weight
        >>> materialize(net, torch.device("cpu"))
        >>> net[1].weight is net[0].weight and not on_meta(net)
        True
    """
    tied = _tied_uses(model)
    model.to_empty(device=device)
    for (_, first, first_name), *others in tied:
        for _, module, name in others:
            module._parameters[name] = first._parameters[first_name]


def load_weights(model: nn.Module, path: str | os.PathLike[str]) -> None:
    """Copy the tensors of ``path`` into ``model``'s parameters and buffers, each rank only
    its own shards of a sharded (DTensor) model; shapes checked, every tensor required.

    Example::

        load_weights(sharded_model, "gpt.safetensors")
    """
    with WeightFile.open(path) as weights:
        targets = model.state_dict()
        sources = _sources(model, targets, weights)
        for name, target in targets.items():
            if not _read_shard(target, weights, sources[name]):
                _copy_in(target, weights.get(sources[name]), name, weights.where)


def _sources(
    model: nn.Module, targets: dict[str, torch.Tensor], weights: WeightFile
) -> dict[str, str]:
    """For each tensor of the model, the name it is read under: its own, or that of a
    parameter it is tied to (a file saved with ties removed holds one of them)."""
    aliases = {name: [n for n, _, _ in uses] for uses in _tied_uses(model) for name, _, _ in uses}
    found = weights.names()
    sources = {}
    for name in targets:
        candidates = [name, *aliases.get(name, [])]  # its own name first
        sources[name] = next((a for a in candidates if a in found), name)
    _check_names({sources[n]: t for n, t in targets.items()}, weights)
    return sources


def _tied_uses(model: nn.Module) -> list[list[tuple[str, nn.Module, str]]]:
    """Each parameter the model uses under several names (a tied embedding and head): its
    uses as (qualified name, module, attribute)."""
    uses: dict[int, list[tuple[str, nn.Module, str]]] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        for attribute, parameter in module._parameters.items():
            if parameter is not None:
                name = f"{prefix}.{attribute}" if prefix else attribute
                uses.setdefault(id(parameter), []).append((name, module, attribute))
    return [found for found in uses.values() if len(found) > 1]


def _copy_in(target: torch.Tensor, full: torch.Tensor, name: str, where: Path) -> None:
    if tuple(full.shape) != tuple(target.shape):
        raise ConfigError(
            f"{where}: {name} has shape {tuple(full.shape)}, the model's is "
            f"{tuple(target.shape)}: the file is for another configuration of the model"
        )
    with torch.no_grad():
        full = full.to(target.dtype)
        if not is_sharded(target):
            target.copy_(full)
            return
        from torch.distributed.tensor import DTensor, distribute_tensor

        assert isinstance(target, DTensor)
        # src_data_rank=None: every rank reads the file and keeps its slice; no traffic.
        mine = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)
        target.to_local().copy_(mine.to_local())


def _read_shard(target: torch.Tensor, weights: WeightFile, name: str) -> bool:
    """Read this rank's rows of a row-sharded DTensor (FSDP's Shard(0), HSDP's too) from the
    file into its local storage: no full tensor, no memory map. False where it cannot."""
    if not is_sharded(target):
        return False
    chunks = target.__create_chunk_list__()  # type: ignore[attr-defined]
    local = target.to_local()  # type: ignore[attr-defined]
    if len(chunks) != 1 or any(chunks[0].offsets[1:]) or not local.is_contiguous():
        return False
    if local.device.type == "cpu":
        return weights.read_rows_into(name, int(chunks[0].offsets[0]), local)
    staged = torch.empty(local.shape, dtype=local.dtype)  # a GPU shard comes through the host
    if not weights.read_rows_into(name, int(chunks[0].offsets[0]), staged):
        return False
    local.copy_(staged)
    return True


def _check_names(targets: dict[str, torch.Tensor], weights: WeightFile) -> None:
    missing = sorted(set(targets) - weights.names())
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise ConfigError(
            f"{weights.where} has no tensor for {shown} of the model: a model on the meta "
            "device has no values of its own, so every parameter and buffer must come from "
            "the weights (non-persistent buffers: build them outside the meta device)"
        )
    extra = sorted(weights.names() - set(targets))
    if extra:
        logger.warning(
            f"warning: {weights.where} holds {len(extra)} tensor(s) the model does not "
            f"have, left out: {', '.join(extra[:5])}"
        )


def _unsaved_buffers(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    for prefix, module in model.named_modules():
        for name in module._non_persistent_buffers_set:
            buffer = module._buffers.get(name)
            if buffer is not None:
                yield (f"{prefix}.{name}" if prefix else name), buffer
