"""Batches of any structure reach the step on the device, and gathering undoes the sharding."""

from __future__ import annotations

import io
from collections import OrderedDict, UserDict, defaultdict, namedtuple
from dataclasses import dataclass

import pytest
import torch

import ddpkit
from ddpkit.data.batches import (
    batch_size_of,
    samples_in,
    slice_batch,
    tensor_leaves,
    to_device,
)
from ddpkit.errors import ConfigError
from ddpkit.train.state import load_entries, save_entries

Pair = namedtuple("Pair", "inputs targets")


@dataclass
class Encoded:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    source: str = "text"


class BatchEncodingLike(UserDict):  # HF's BatchEncoding is a UserDict with .to()
    pass


class Graph:
    """Moves itself, as PyG's Data does."""

    def __init__(self) -> None:
        self.moved_to: torch.device | None = None

    def to(self, device: torch.device) -> Graph:
        self.moved_to = device
        return self


def test_every_structure_keeps_its_type_and_moves_its_tensors() -> None:
    meta = torch.device("meta")  # stands in for a GPU: every tensor must end up there
    batch = {
        "pair": Pair(torch.zeros(2, 3), torch.ones(2)),
        "encoded": Encoded(torch.zeros(2, 4), torch.ones(2, 4)),
        "hf": BatchEncodingLike({"input_ids": torch.zeros(2, 5)}),
        "ordered": OrderedDict(a=torch.zeros(2)),
        "counts": defaultdict(int, b=torch.zeros(2)),
        "list": [torch.zeros(2), "keep", 3, None],
        "graph": Graph(),
    }
    moved = to_device(batch, meta)
    assert isinstance(moved["pair"], Pair) and isinstance(moved["encoded"], Encoded)
    assert isinstance(moved["hf"], BatchEncodingLike) and isinstance(moved["ordered"], OrderedDict)
    assert type(moved["counts"]) is dict  # its factory cannot be rebuilt: a plain dict
    assert moved["list"][1:] == ["keep", 3, None] and moved["encoded"].source == "text"
    assert moved["graph"].moved_to == meta
    assert all(t.device == meta for t in tensor_leaves(moved))
    assert len(list(tensor_leaves(moved))) == 8


@pytest.mark.parametrize("kind", [tuple, list, dict])
def test_a_batch_already_in_place_keeps_its_tensors_in_a_container_of_its_own(kind: type) -> None:
    x, y = torch.zeros(2, 3), torch.ones(2)
    batch = {"x": x, "y": y} if kind is dict else kind((x, y))
    moved = to_device(batch, "cpu")
    assert type(moved) is kind
    same = list(moved.values()) if kind is dict else list(moved)
    assert same[0] is x and same[1] is y  # not copied
    if kind is not tuple:  # a list or dict the caller may change: not the loader's own
        assert moved is not batch
    assert batch_size_of(batch) == 2


def test_size_and_slice_follow_the_first_tensor() -> None:
    batch = {"ids": ["a", "b", "c"], "x": torch.arange(3), "scale": torch.tensor(2.0)}
    assert batch_size_of(batch) == 3
    cut = slice_batch(batch, 2)
    assert cut["x"].tolist() == [0, 1] and cut["scale"].item() == 2.0 and cut["ids"] == batch["ids"]
    with pytest.raises(ConfigError, match="cannot tell the batch size of a list"):
        batch_size_of(["no", "tensor"])
    assert samples_in(["no", "tensor"]) is None and samples_in(batch) == 3


def test_all_gather_in_a_world_of_one_returns_rows() -> None:
    assert ddpkit.all_gather(torch.tensor(4.0)).tolist() == [4.0]
    assert ddpkit.all_gather(torch.ones(2, 3)).shape == (2, 3)


def test_gather_for_metrics_in_one_process_keeps_the_loader_order() -> None:
    ddpkit.init(hang_timeout=0)
    data = torch.utils.data.TensorDataset(torch.arange(7.0))
    loader = ddpkit.prepare_loader(data, batch_size=3, shuffle=True)
    rows = torch.cat([x for (x,) in loader])
    preds, again = ddpkit.gather_for_metrics((rows, {"x": rows}), loader)
    assert preds.tolist() == rows.tolist() == again["x"].tolist()
    with pytest.raises(ConfigError, match="got 6 rows on rank 0, but its shard of the loader"):
        ddpkit.gather_for_metrics(rows[:6], loader)


def test_state_entries_round_trip_and_refuse_what_cannot_load_safely() -> None:
    ema = torch.nn.Linear(2, 2)
    state = {"ema": ema, "counter": 7, "vocab": ["a", "b"], "best": torch.tensor(0.5)}
    buffer = io.BytesIO()
    torch.save(save_entries(state), buffer)  # as a checkpoint holds it
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    with torch.no_grad():
        ema.weight.zero_()
    state["counter"] = 0
    load_entries(state, saved)
    assert state["counter"] == 7 and ema.weight.abs().sum() > 0
    with pytest.raises(ConfigError, match=r"state\['cfg'\] holds a object"):
        save_entries({"cfg": {"nested": object()}})
