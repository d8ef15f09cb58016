"""A sharded model's state (FSDP, HSDP: DTensors) as each rank's own shards, and back.

A state that leaves the process (a replica group's heal sent to a peer, a memory snapshot
kept in ``/dev/shm``) goes as plain tensors, each rank's shard (:func:`local_state`): a DTensor
would carry its device mesh, which a ``weights_only`` load refuses and which names the
sender's process groups. It is made into DTensors again with the receiving run's own mesh and
placements (:func:`resharded`), the parameters' and the optimizers' state alike. Rank ``r``
of every replica group holds the same shard of every parameter (the groups have the same
size and the same wrapping), so their gradients are averaged shard by shard (:func:`local`).

Example::

    sent = local_state(run.state_dict())             # on the live peer
    run.load_state_dict(resharded(sent, run))        # on the group that heals
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from ddpkit.runtime.tensortree import map_tensors


def is_sharded(tensor: Any) -> bool:
    """Whether ``tensor`` is a DTensor (nothing is imported where no sharded model is).

    Example:
        >>> is_sharded(torch.zeros(2))
        False
    """
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(tensor, dtensor.DTensor)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``tensor`` (a view of its memory), or ``tensor`` itself.

    Example:
        >>> local(torch.ones(2)).tolist()
        [1.0, 1.0]
    """
    return tensor.to_local() if is_sharded(tensor) else tensor  # type: ignore[attr-defined]


def local_state(state: Any) -> Any:
    """A nested state with every DTensor replaced by this rank's shard.

    Example:
        >>> local_state({"w": torch.ones(1), "step": 3})
        {'w': tensor([1.]), 'step': 3}
    """
    return map_tensors(state, lambda t: local(t).detach())


def resharded(state: dict[str, Any], run: Any) -> dict[str, Any]:
    """``state`` as :func:`local_state` sent it, its shards made DTensors again like this
    run's own: the models' by the tensor at the same place in ``run.state_dict()``, the
    optimizers' by the parameter each entry belongs to (a group that has not stepped yet
    has no optimizer state to copy the layout from)."""
    template = run.state_dict()
    rebuilt: dict[str, Any] = _like(state, template)
    for name, saved in _optimizer_states(rebuilt, run.optimizers).items():
        optimizer = run.optimizers[name]
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for index, entry in saved.get("state", {}).items():
            param = params[int(index)]
            if is_sharded(param):
                saved["state"][index] = {key: _shard_like(value, param)
                                         for key, value in entry.items()}  # fmt: skip
    return rebuilt


def _optimizer_states(state: dict[str, Any], optimizers: dict[str, Any]) -> dict[str, Any]:
    """The optimizers' states in ``state`` by name (RunState's one-optimizer form too)."""
    if "optimizers" in state:
        return dict(state["optimizers"])
    if "optimizer" in state and optimizers:
        return {next(iter(optimizers)): state["optimizer"]}
    return {}


def _like(received: Any, template: Any) -> Any:
    if isinstance(received, torch.Tensor) and is_sharded(template):
        return _shard_like(received, template)
    if isinstance(received, dict) and isinstance(template, dict):
        return {key: _like(value, template.get(key)) for key, value in received.items()}
    alike = isinstance(template, list | tuple) and len(template) == len(received)
    if isinstance(received, list | tuple) and alike:
        return type(received)(_like(v, t) for v, t in zip(received, template, strict=True))
    return received


def _shard_like(value: Any, like: torch.Tensor) -> Any:
    """``value`` (this rank's shard) as a DTensor placed as ``like``; a value of another
    shape (an optimizer's step count) stays as it is."""
    from torch.distributed.tensor import DTensor

    if not isinstance(value, torch.Tensor) or value.shape != local(like).shape:
        return value
    assert isinstance(like, DTensor)
    return DTensor.from_local(value.to(local(like).device), like.device_mesh, like.placements,
                              shape=like.shape, stride=like.stride())  # fmt: skip
