"""FaultTolerantStrategy's refusals, before any torchft call: the extra to install, the
group and the lighthouse it needs, DDP's options passed on alone."""

from __future__ import annotations

import sys

import pytest
import torch

from ddpkit.errors import ConfigError
from ddpkit.parallel.faulttolerant import FaultTolerantStrategy, ReplicaGroups


class World:
    rank, world_size, device = 0, 1, torch.device("cpu")


@pytest.fixture(autouse=True)
def rust_log(monkeypatch) -> None:
    """torchft's log level, which ddpkit sets before importing it, restored after the test."""
    monkeypatch.setenv("RUST_LOG", "warn")


def test_without_torchft_the_error_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torchft", None)  # import now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'ddpkit\[ft\]'"):
        ReplicaGroups(FaultTolerantStrategy(group="0", lighthouse="http://h:1"), World())


def test_the_group_and_the_lighthouse_are_asked_for(monkeypatch) -> None:
    monkeypatch.delenv("DDPKIT_FT_GROUP", raising=False)
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    with pytest.raises(ConfigError, match="DDPKIT_FT_GROUP=0"):
        _ = FaultTolerantStrategy().layout
    pytest.importorskip("torchft")
    with pytest.raises(ConfigError, match="TORCHFT_LIGHTHOUSE"):
        ReplicaGroups(FaultTolerantStrategy(group="0"), World())


def test_only_ddps_own_options_reach_torchs_ddp() -> None:
    strategy = FaultTolerantStrategy(group="0", timeout_s=5, bucket_cap_mb=50)
    assert strategy._torch_options() == {"bucket_cap_mb": 50}
    assert "lighthouse" in FaultTolerantStrategy.fields()


@pytest.mark.timeout(60)
def test_an_unreachable_lighthouse_is_named_with_its_address(monkeypatch) -> None:
    pytest.importorskip("torchft")
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # the group's store, as ddpkit run sets it
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    strategy = FaultTolerantStrategy(group="0", lighthouse="http://127.0.0.1:1", timeout_s=2)
    said = r"could not reach the lighthouse at http://127.0.0.1:1 within 2 s"
    with pytest.raises(ConfigError, match=said):
        ReplicaGroups(strategy, World())
