"""How the model is parallelized, chosen by name: ``"ddp"`` (default) or ``"none"``.

DDP is torch's ``DistributedDataParallel``: every rank holds a replica, gradients are averaged
by all-reduce during ``backward()``, and rank 0's initial weights are broadcast at wrap time so
replicas start identical. In a world of one there is nothing to average, so the model is left
unwrapped; the training code is the same either way.

Example:
    >>> import torch, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> model = ddpkit.prepare_model(torch.nn.Linear(4, 2))
    >>> type(unwrap_model(model)).__name__
    'Linear'
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddpkit.errors import ConfigError
from ddpkit.rendezvous import current_world

STRATEGIES = ("ddp", "none")


def prepare_model(model: nn.Module, strategy: str = "ddp") -> nn.Module:
    """Move ``model`` to this rank's device and wrap it for data-parallel training.

    ``strategy="ddp"`` wraps in DistributedDataParallel when the world has more than one
    process; ``"none"`` only moves the model. Call ``ddpkit.init()`` first.

    Example:
        >>> import torch, ddpkit
        >>> _ = ddpkit.init()
        ddpkit: world size 1 ...
        >>> ddpkit.prepare_model(torch.nn.Linear(4, 2), strategy="none")
        Linear(in_features=4, out_features=2, bias=True)
        >>> ddpkit.shutdown()
    """
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"unknown strategy {strategy!r}; choose one of {', '.join(repr(s) for s in STRATEGIES)}"
        )
    world = current_world()
    model = model.to(world.device)
    if strategy == "none" or world.world_size == 1:
        return model
    device_ids = [world.device.index] if world.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's own module inside a DDP wrapper (or the model itself when unwrapped).

    Its ``state_dict()`` has no ``module.`` prefix, so it loads without ddpkit.

    Example:
        >>> import torch
        >>> unwrap_model(torch.nn.Linear(2, 2)).in_features
        2
    """
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    assert isinstance(inner, nn.Module)
    return inner
