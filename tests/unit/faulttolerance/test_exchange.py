"""Where replica groups meet: an address the other groups reach, a store bound there alone,
and gloo on an interface that leaves the host (the real two-host run is
tests/multiproc/faulttolerance/test_groups_on_hosts.py)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from ddpkit.env.world import World
from ddpkit.errors import ConfigError
from ddpkit.faulttolerance import exchange
from ddpkit.launch.plan import LaunchPlan, worker_env_defaults

ELSEWHERE = "http://10.9.9.9:29510"  # a lighthouse on another host, reached over eth0


@pytest.fixture
def routed_over_eth0(monkeypatch: pytest.MonkeyPatch) -> None:
    """This host reaches 10.9.9.9 from 10.9.9.4 over eth0 (no such network needed)."""
    route = lambda host: ("10.9.9.4", "eth0") if host == "10.9.9.9" else ("127.0.0.1", "lo")  # noqa: E731
    monkeypatch.setattr(exchange, "route_to", route)
    monkeypatch.setattr("ddpkit._core.system.route_to", route)


def test_the_groups_meet_on_loopback_when_the_lighthouse_is_here() -> None:
    assert exchange.meeting_address("http://127.0.0.1:29510") == "127.0.0.1"
    assert exchange.meeting_address("127.0.0.1:29510") == "127.0.0.1"


def test_they_meet_at_the_address_this_host_reaches_the_lighthouse_from(routed_over_eth0) -> None:
    assert exchange.meeting_address(ELSEWHERE) == "10.9.9.4"


def test_a_lighthouse_with_no_route_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exchange, "route_to", lambda host: ("?", None))
    with pytest.raises(ConfigError, match=r"no route to the lighthouse at http://nowhere:1"):
        exchange.meeting_address("http://nowhere:1")


def test_the_exchange_store_listens_on_the_meeting_address_alone() -> None:
    world = World(rank=0, world_size=1, local_rank=0, local_world_size=1)
    store, port = exchange.exchange_store(world, "127.0.0.1", timedelta(seconds=5))
    assert store is not None and port == store.port
    store.set("k", "v")
    # /proc/net/tcp's listening sockets (state 0A): 127.0.0.1 only, not 0.0.0.0 (every address)
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    listening = [row[1] for row in rows if row[3] == "0A"]
    assert f"0100007F:{port:04X}" in listening, listening
    assert f"00000000:{port:04X}" not in listening


def test_gloo_kept_on_loopback_while_the_lighthouse_is_elsewhere_is_refused(
    routed_over_eth0, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    with pytest.raises(ConfigError, match=r"GLOO_SOCKET_IFNAME=lo keeps gloo off .* \(eth0\).*"
                                          r"set GLOO_SOCKET_IFNAME=eth0"):  # fmt: skip
        exchange.check_gloo_interface(ELSEWHERE, "10.9.9.4")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    exchange.check_gloo_interface(ELSEWHERE, "10.9.9.4")  # the route's own: accepted


def test_gloo_on_a_host_name_that_resolves_to_loopback_is_refused(
    routed_over_eth0, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(exchange, "_resolved", lambda name: "127.0.1.1")  # Debian's /etc/hosts
    with pytest.raises(ConfigError, match=r"resolves to loopback.*GLOO_SOCKET_IFNAME=eth0"):
        exchange.check_gloo_interface(ELSEWHERE, "10.9.9.4")


def test_any_gloo_setting_does_when_every_group_is_on_this_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    exchange.check_gloo_interface("http://127.0.0.1:29510", "127.0.0.1")


def test_ddpkit_run_puts_gloo_on_the_route_to_a_lighthouse_elsewhere(
    routed_over_eth0, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    assert worker_env_defaults(LaunchPlan(nproc=2))["GLOO_SOCKET_IFNAME"] == "lo"
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", ELSEWHERE)
    assert worker_env_defaults(LaunchPlan(nproc=2))["GLOO_SOCKET_IFNAME"] == "eth0"
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://127.0.0.1:29510")
    assert worker_env_defaults(LaunchPlan(nproc=2))["GLOO_SOCKET_IFNAME"] == "lo"
