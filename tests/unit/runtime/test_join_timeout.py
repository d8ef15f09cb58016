"""How long ranks wait for each other at start, by default."""

from __future__ import annotations

import pytest

from ddpkit.env.initmethod import InitMethod
from ddpkit.env.world import World
from ddpkit.runtime.session import default_join_timeout

ENV = InitMethod("env")


def test_ranks_on_one_machine_wait_30_s_and_a_second_more_per_rank_past_its_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})  # 2 cores
    on_loopback = World(master_addr="127.0.0.1")
    assert default_join_timeout(on_loopback, ENV) == 30.0
    assert default_join_timeout(World(master_addr="127.0.0.1", world_size=64), ENV) == 92.0


def test_ranks_across_machines_wait_300_s() -> None:
    assert default_join_timeout(World(master_addr="10.0.0.5", world_size=64), ENV) == 300.0
