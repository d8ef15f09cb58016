"""Init URLs as the tutorials write them, Windows paths included (no processes)."""

from __future__ import annotations

import pytest

from ddpkit import ConfigError
from ddpkit.env.initmethod import InitMethod, parse_init_method
from ddpkit.env.world import World


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("env://", InitMethod("env")),
        ("tcp://10.0.0.1:23456", InitMethod("tcp", host="10.0.0.1", port=23456)),
        ("tcp://[::1]:29500", InitMethod("tcp", host="::1", port=29500)),
        ("file:///tmp/pg", InitMethod("file", path="/tmp/pg")),
        ("file:///D:\\pg", InitMethod("file", path="D:\\pg")),  # the tutorial's command line
        ("file:///D:/pg", InitMethod("file", path="D:/pg")),
        ("file://D:/pg", InitMethod("file", path="D:/pg")),
    ],
)
def test_accepted_forms(url: str, parsed: InitMethod) -> None:
    assert parse_init_method(url) == parsed


@pytest.mark.parametrize(
    "url", ["localhost:29500", "udp://h:1", "tcp://host", "tcp://:29500", "tcp://h:0",
            "tcp://h:99999", "file://relative/pg", "file:///"],
)  # fmt: skip
def test_malformed_urls_name_the_accepted_forms(url: str) -> None:
    with pytest.raises(ConfigError, match="accepted forms: env://, tcp://HOST:PORT, file:///"):
        parse_init_method(url)


@pytest.mark.parametrize(("kind", "expected"), [("tcp", "host"), ("env", "connect")])
def test_under_torchs_agent_rank0_hosts_a_tcp_url_itself(
    kind: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's store is at MASTER_ADDR:MASTER_PORT; a tcp:// URL names another endpoint."""
    import ddpkit.runtime.stores

    calls: list[str] = []
    monkeypatch.setattr(ddpkit.runtime.stores, "_host_tcp_store", lambda *a: calls.append("host"))
    monkeypatch.setattr(
        ddpkit.runtime.stores, "_connect_tcp_store", lambda *a: calls.append("connect")
    )
    world = World(rank=0, world_size=2, master_addr="127.0.0.1", master_port=29500,
                  launcher="torchrun", agent_store=True)  # fmt: skip
    method = InitMethod("tcp", host="127.0.0.1", port=23456) if kind == "tcp" else InitMethod("env")
    ddpkit.runtime.stores.open_store(world, method, join_timeout=1)
    assert calls == [expected]
