"""Init URLs as the tutorials write them, Windows paths included (no processes)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ddpkit import ConfigError, RendezvousError
from ddpkit.env.initmethod import InitMethod, parse_init_method
from ddpkit.env.world import World
from ddpkit.runtime.stores import clear_stale_file_store


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


def make_stale(path: Path, age_s: float) -> None:
    path.write_bytes(b"\x08\x00\x00\x00refcount")
    old = time.time() - age_s
    os.utime(path, (old, old))


def test_rank0_removes_a_stale_store_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store_file = tmp_path / "pg"
    make_stale(store_file, age_s=3600)
    clear_stale_file_store(str(store_file), rank=0, join_timeout=30)
    assert not store_file.exists()
    assert f"removed stale FileStore file {store_file}" in capsys.readouterr().out


def test_a_recent_store_file_is_left_alone(tmp_path: Path) -> None:
    store_file = tmp_path / "pg"
    make_stale(store_file, age_s=5)  # another rank of this job may have just made it
    clear_stale_file_store(str(store_file), rank=0, join_timeout=30)
    assert store_file.exists()


def test_other_ranks_wait_for_rank0_then_name_the_file(tmp_path: Path) -> None:
    store_file = tmp_path / "pg"
    make_stale(store_file, age_s=3600)
    start = time.monotonic()
    with pytest.raises(RendezvousError, match=f"rm {store_file}"):
        clear_stale_file_store(str(store_file), rank=1, join_timeout=1)
    assert 1 <= time.monotonic() - start < 5
    assert store_file.exists()  # only rank 0 deletes


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
