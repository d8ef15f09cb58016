"""Batches of any structure: moved to a device, counted, cut, taken apart into tensors.

A batch is whatever the DataLoader's ``collate_fn`` returns: a tensor, a tuple or list
(``(inputs, targets)``), a namedtuple, a dict of token ids, a dataclass, a Hugging Face
``BatchEncoding`` or any other mapping, nested as deep as you like. The Trainer and
:class:`~ddpkit.train.loop.TrainLoop` move every tensor in it to the rank's device and keep
the structure (and its type, where the type can be rebuilt); anything that is not a tensor
(strings, numbers, None) passes through. Objects with their own ``.to(device)`` (a graph
batch, say) are moved by it.

The number of samples in a batch is the first dimension of its first tensor, in the order
the structure lists them (a mapping's insertion order, a dataclass's field order).

Example:
    >>> import torch
    >>> batch = {"input_ids": torch.zeros(4, 8, dtype=torch.long), "ids": ["a", "b", "c", "d"]}
    >>> moved = to_device(batch, torch.device("cpu"))
    >>> batch_size_of(moved), moved["ids"][0]
    (4, 'a')
    >>> slice_batch(moved, 2)["input_ids"].shape
    torch.Size([2, 8])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ddpkit.errors import ConfigError


def to_device(batch: Any, device: torch.device | str) -> Any:
    """``batch`` with every tensor in it on ``device``, structure and types kept.

    Example:
        >>> import torch
        >>> x, y = to_device((torch.zeros(2, 3), torch.ones(2)), "cpu")
        >>> x.device.type, y.shape
        ('cpu', torch.Size([2]))
    """
    target = torch.device(device)
    kind = type(batch)
    if kind is tuple or kind is list or kind is dict:  # most batches: one look, no call
        for item in batch.values() if kind is dict else batch:
            if type(item) is not torch.Tensor or item.device != target:
                break
        else:  # all there already: the same structure, a container of its own
            return batch if kind is tuple else kind(batch)
    if target.type == "cpu":  # a CPU tensor stays as it is: no call per tensor
        return _map_tensors(batch, lambda t: t if t.is_cpu else t.to(target), target)
    return _map_tensors(batch, lambda t: t.to(target, non_blocking=True), target)


def slice_batch(batch: Any, count: int) -> Any:
    """The first ``count`` samples of ``batch``: every tensor cut along its first dimension.

    Example:
        >>> import torch
        >>> slice_batch((torch.arange(5), torch.arange(5) * 2), 2)
        (tensor([0, 1]), tensor([0, 2]))
    """
    return _map_tensors(batch, lambda t: t[:count] if t.dim() else t, None)


def batch_size_of(batch: Any) -> int:
    """Number of samples in a batch: the first dimension of its first tensor.

    Example:
        >>> import torch
        >>> batch_size_of((torch.zeros(5, 3), torch.zeros(5)))
        5
        >>> batch_size_of({"text": ["no tensor"]})
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: cannot tell the batch size of a dict: it holds no tensor ...
    """
    samples = samples_in(batch)
    if samples is None:
        raise ConfigError(
            f"cannot tell the batch size of a {type(batch).__name__}: it holds no tensor with "
            "a first dimension"
        )
    return samples


def samples_in(batch: Any) -> int | None:
    """Number of samples in a batch, as :func:`batch_size_of` tells it; None where it cannot
    (no tensor with a first dimension: the caller says what to do about it, if it needs one).

    Example:
        >>> import torch
        >>> samples_in({"input_ids": torch.zeros(3, 8)}), samples_in(["no", "tensor"])
        (3, None)
    """
    kind = type(batch)
    first = None
    if (kind is tuple or kind is list) and batch:
        first = batch[0]
    elif kind is dict and batch:  # a tokenizer's {"input_ids": ..., "labels": ...}
        first = next(iter(batch.values()))
    if isinstance(first, torch.Tensor) and first.dim():  # most batches: no walk
        return int(first.shape[0])
    for tensor in tensor_leaves(batch):
        if tensor.dim():
            return int(tensor.shape[0])
    return None


def tensor_leaves(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``batch``, in the order its structure lists them.

    Example:
        >>> import torch
        >>> [t.tolist() for t in tensor_leaves({"a": torch.tensor([1]), "b": (torch.tensor([2]),)})]
        [[1], [2]]
    """
    if isinstance(batch, torch.Tensor):
        yield batch
    elif _is_dataclass_instance(batch):
        for field in dataclasses.fields(batch):
            yield from tensor_leaves(getattr(batch, field.name))
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from tensor_leaves(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from tensor_leaves(value)


def _map_tensors(
    batch: Any, fn: Callable[[torch.Tensor], torch.Tensor], device: torch.device | None
) -> Any:
    """``batch`` rebuilt with ``fn`` applied to every tensor (``device``: also move ``.to``-able
    objects)."""

    def again(value: Any) -> Any:
        return _map_tensors(value, fn, device)

    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if type(batch) in (tuple, list):  # most batches: neither a dataclass nor a namedtuple
        return type(batch)(map(again, batch))
    if _is_dataclass_instance(batch):
        changes = {
            f.name: again(getattr(batch, f.name)) for f in dataclasses.fields(batch) if f.init
        }
        return dataclasses.replace(batch, **changes)
    if isinstance(batch, Mapping):
        return _rebuilt_mapping(batch, {key: again(value) for key, value in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*map(again, batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map(again, batch))
    if device is not None and callable(getattr(batch, "to", None)) and not isinstance(batch, str):
        return batch.to(device)
    return batch


def _rebuilt_mapping(original: Mapping[Any, Any], items: dict[Any, Any]) -> Mapping[Any, Any]:
    # BatchEncoding, UserDict, OrderedDict: rebuilt as their own type; one whose constructor
    # wants more (a defaultdict's factory) becomes a plain dict.
    try:
        rebuilt: Mapping[Any, Any] = type(original)(items)  # type: ignore[call-arg]
    except TypeError:
        return items
    return rebuilt


def _is_dataclass_instance(value: object) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)
