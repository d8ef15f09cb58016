"""World detection from the launcher's environment (no processes)."""

from __future__ import annotations

import pytest
import torch

from ddpkit import ConfigError, World
from ddpkit.world import choose_backend

TORCHRUN = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}


def test_no_launcher_is_a_world_of_one() -> None:
    world = World.detect(environ={})
    assert (world.rank, world.local_rank, world.world_size, world.node_rank) == (0, 0, 1, 0)
    assert world.is_main and not world.is_launched
    assert world.device == torch.device("cpu") and world.backend == "gloo"


def test_torchrun_contract_is_read() -> None:
    world = World.detect(environ=TORCHRUN)
    assert (world.rank, world.local_rank, world.world_size) == (3, 1, 4)
    assert (world.local_world_size, world.node_rank, world.num_nodes) == (2, 1, 2)
    assert (world.master_addr, world.master_port) == ("10.0.0.1", 29500)
    assert world.launcher == "torchrun" and not world.is_main


def test_node_rank_and_local_rank_are_derived_when_absent() -> None:
    env = {k: v for k, v in TORCHRUN.items() if k not in ("GROUP_RANK", "LOCAL_RANK")}
    world = World.detect(environ=env)
    assert (world.node_rank, world.local_rank) == (1, 1)


def test_world_is_frozen() -> None:
    world = World.detect(environ={})
    with pytest.raises(AttributeError):
        world.rank = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"RANK": "two"}, "RANK='two' is not an integer"),
        ({"RANK": "4"}, "RANK=4 is outside 0..3"),
        ({"LOCAL_RANK": "2"}, "LOCAL_RANK=2 is outside 0..1"),
        ({"WORLD_SIZE": "0"}, "must be >= 1"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port"),
    ],
)
def test_bad_values_name_the_variable(change: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        World.detect(environ={**TORCHRUN, **change})


def test_half_set_contract_says_what_is_missing() -> None:
    with pytest.raises(ConfigError, match="RANK is set but WORLD_SIZE is not"):
        World.detect(environ={"RANK": "0"})


def test_multi_process_world_needs_master_address() -> None:
    env = {k: v for k, v in TORCHRUN.items() if k != "MASTER_ADDR"}
    with pytest.raises(ConfigError, match="MASTER_ADDR/MASTER_PORT are not set"):
        World.detect(environ=env)


def test_backend_choice() -> None:
    cpu = torch.device("cpu")
    assert choose_backend(None, cpu) == "gloo"
    assert choose_backend("gloo", cpu) == "gloo"
    with pytest.raises(ConfigError, match="needs CUDA GPUs"):
        choose_backend("nccl", cpu)
    with pytest.raises(ConfigError, match="unknown backend 'ncl'"):
        choose_backend("ncl", cpu)


def test_describe_names_sizes_backend_and_device() -> None:
    text = World.detect(environ=TORCHRUN).describe()
    assert "world size 4" in text and "2 processes per node x 2 nodes" in text
    assert "backend gloo" in text and "device cpu" in text
