"""A state's tensors, wherever they sit in its dicts, lists and tuples: changed one by one,
or counted in bytes. One walk for every copy ddpkit makes of a state (a background save's CPU
copy, random states onto the CPU, a healed group's received state).

Example:
    >>> state = {"w": torch.ones(2), "groups": [{"lr": 0.1}], "step": 3}
    >>> map_tensors(state, lambda t: t * 2)["w"], tensor_bytes(state)
    (tensor([2., 2.]), 8)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def map_tensors(state: Any, change: Callable[[torch.Tensor], Any]) -> Any:
    """``state`` with ``change`` applied to each tensor in it; containers keep their types
    (an ``OrderedDict`` stays one, a named tuple stays one), anything else is kept as it is.

    Example:
        >>> map_tensors((torch.zeros(1), "x"), lambda t: t + 1)
        (tensor([1.]), 'x')
    """
    if isinstance(state, torch.Tensor):
        return change(state)
    if isinstance(state, dict):
        return type(state)(
            (key, value if type(value) in _PLAIN else map_tensors(value, change))
            for key, value in state.items()
        )
    if isinstance(state, list | tuple):
        # A memory snapshot walks the run's state every step: an optimizer's lists of
        # parameter numbers are most of its leaves, kept here without a call each.
        items = [value if type(value) in _PLAIN else map_tensors(value, change)
                 for value in state]  # fmt: skip
        return type(state)(*items) if hasattr(state, "_fields") else type(state)(items)
    return state


_PLAIN = frozenset({int, float, str, bool, type(None), bytes})  # leaves, kept as they are


def tensor_bytes(state: Any) -> int:
    """The bytes of every tensor in ``state``; of a sharded tensor, this rank's shard.

    Example:
        >>> tensor_bytes({"w": torch.zeros(4), "opt": [torch.zeros(2, 2)], "step": 3})
        32
    """
    if isinstance(state, torch.Tensor):
        here = state.to_local() if hasattr(state, "to_local") else state
        return int(here.nelement() * here.element_size())
    if isinstance(state, dict):
        return sum(tensor_bytes(value) for value in state.values())
    if isinstance(state, list | tuple):
        return sum(tensor_bytes(value) for value in state)
    return 0
