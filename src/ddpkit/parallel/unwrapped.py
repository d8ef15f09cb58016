"""``strategy="none"``: the model only moved to the device; also any model no strategy owns.

Example:
    >>> import torch
    >>> UNWRAPPED.owns(torch.nn.Linear(1, 1))
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from ddpkit.parallel.base import Strategy

if TYPE_CHECKING:
    from ddpkit.env.world import World


class Unwrapped(Strategy):
    """No wrapper: with several ranks, each trains its own copy (nothing is averaged).

    Example:
        >>> Unwrapped().name
        'none'
    """

    name = "none"

    def wrap(self, model: nn.Module, world: World) -> nn.Module:
        return model.to(world.device)

    def owns(self, model: nn.Module) -> bool:
        return True  # asked last: a model no other strategy wrapped


UNWRAPPED = Unwrapped()
