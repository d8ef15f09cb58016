"""Waiting for the master's name: a deadline and one clear message (no network: the
resolver is patched)."""

from __future__ import annotations

import socket

import pytest

from ddpkit import RendezvousError
from ddpkit.env import dns


class FakeResolver:
    """Fails until ``appears_at`` on a fake clock that each sleep advances."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, appears_at: float) -> None:
        self.now, self.appears_at = 0.0, appears_at
        monkeypatch.setattr(dns.time, "sleep", self.sleep)
        monkeypatch.setattr(dns.socket, "getaddrinfo", self.getaddrinfo)

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def getaddrinfo(self, host: str, *args: object, **kwargs: object) -> list:
        if self.now < self.appears_at:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", 0))]


def test_a_name_that_appears_late_is_waited_for_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    resolver = FakeResolver(monkeypatch, appears_at=20.0)
    said: list[str] = []
    addresses = dns.wait_for_name("wine-node-0-0.wine", 120.0, said.append, lambda: resolver.now)
    assert addresses == ["10.0.0.7"]
    assert (
        said[0]
        == "waiting for wine-node-0-0.wine to resolve (Name or service not known); 120 s left"
    )
    assert said[-1] == "wine-node-0-0.wine resolves to 10.0.0.7 after 20 s"
    assert said[1].endswith("; 110 s left") and len(said) == 3  # every 10 s, not every second


def test_past_the_deadline_the_error_names_host_seconds_and_what_to_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resolver = FakeResolver(monkeypatch, appears_at=1e9)
    with pytest.raises(RendezvousError) as raised:
        dns.wait_for_name("master-0.myjob", 30.0, lambda _: None, lambda: resolver.now)
    message = str(raised.value)
    assert message.startswith("master-0.myjob not resolvable after 30 s: Name or service not known")
    assert "headless service" in message and "DDPKIT_DNS_TIMEOUT" in message


def test_the_deadline_is_a_setting_with_a_checked_value() -> None:
    assert dns.dns_timeout({}) == 120.0
    assert dns.dns_timeout({"DDPKIT_DNS_TIMEOUT": "0"}) == 0.0
    with pytest.raises(Exception, match="DDPKIT_DNS_TIMEOUT='soon' must be a number"):
        dns.dns_timeout({"DDPKIT_DNS_TIMEOUT": "soon"})
    assert dns.is_address("::1") and not dns.is_address("wine-node-0-0.wine")
