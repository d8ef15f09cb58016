"""One walk over a state's tensors: every container kept as it was, every tensor reached."""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import torch

from ddpkit.runtime.tensortree import map_tensors, tensor_bytes


class Pair(NamedTuple):
    first: torch.Tensor
    second: int


def test_containers_keep_their_types_and_every_tensor_is_changed() -> None:
    state = OrderedDict(w=torch.ones(2), rest=[Pair(torch.ones(3), 7), (torch.ones(1),)])
    doubled = map_tensors(state, lambda t: t * 2)
    assert type(doubled) is OrderedDict and list(doubled) == ["w", "rest"]
    assert isinstance(doubled["rest"][0], Pair) and doubled["rest"][0].second == 7
    assert torch.equal(doubled["rest"][0].first, torch.full((3,), 2.0))
    assert torch.equal(doubled["rest"][1][0], torch.full((1,), 2.0))
    assert torch.equal(state["w"], torch.ones(2))  # the original is left as it was


def test_bytes_count_every_tensor_at_any_depth_and_nothing_else() -> None:
    state = {"a": torch.zeros(3, dtype=torch.float64), "b": [{"c": torch.zeros(2)}], "n": 5}
    assert tensor_bytes(state) == 3 * 8 + 2 * 4
    assert tensor_bytes({"lr": 0.1, "name": "sgd"}) == 0
