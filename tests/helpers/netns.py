"""Hosts for the tests: network namespaces on one virtual switch, each with its own address,
interface ``eth0`` and host name (``/etc/netns/NS/hosts``, which ``ip netns exec`` mounts as
``/etc/hosts``); this machine reaches them through the switch at ``10.250.N.1``, each network
on a subnet of its own (a session's two-node SLURM cluster keeps its network while other
tests make theirs).

Nothing outside the namespaces is contacted. :func:`virtual_hosts` skips the test with the
reason where namespaces cannot be made (not root, no iproute2). Switches and namespaces carry
the pid of the test process that made them: those of a process that no longer runs (a test
run killed before it could clean up) are removed first, since their switch would hold the
same address and take the new hosts' traffic.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

_networks = itertools.count()  # this process's networks, for unique names


@dataclass(frozen=True)
class VirtualHost:
    namespace: str
    name: str  # its host name, known to every host's /etc/hosts
    address: str
    cable: str  # the switch's end of its link
    switch: str  # the switch's address: this machine, as the host sees it
    interface: str = "eth0"
    bridge: str = ""  # the switch's link name here (for add_host)

    def limit_rate(self, rate: str) -> None:
        """Shape this host's link to ``rate`` (tc's units, "40mbit") both ways: a bad port.

        tc's ``tbf``: this kernel has no ``netem`` (``tc qdisc ... netem`` says "Specified
        qdisc kind is unknown"), and a rate limit is what a bad cable or port does.
        """
        shaping = ["root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
        ip_or_tc = ["tc", "qdisc", "add", "dev"]
        subprocess.run([*ip_or_tc, self.cable, *shaping], check=True, capture_output=True)
        subprocess.run(["ip", "netns", "exec", self.namespace, *ip_or_tc, self.interface,
                        *shaping], check=True, capture_output=True)  # fmt: skip

    def command(self, *argv: str) -> list[str]:
        """``argv`` run on this host: its network, its host name, its /etc/hosts.

        Not ``ip netns exec``, which also mounts a new /sys and so hides the cgroup file
        systems slurmd needs: only the network is entered, and /etc/hosts is bind-mounted in
        a private mount namespace.
        """
        hosts_file = f"/etc/netns/{self.namespace}/hosts"
        script = f'mount --bind {hosts_file} /etc/hosts && hostname {self.name} && exec "$@"'
        return ["nsenter", f"--net=/run/netns/{self.namespace}", "unshare", "--uts", "--mount",
                "--", "sh", "-c", script, "sh", *argv]  # fmt: skip


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def virtual_hosts(
    count: int, prefix: str = "dkhost", names: list[str] | None = None
) -> Iterator[list[VirtualHost]]:
    """``count`` hosts named PREFIX1.. (or ``names``), at 10.250.N.2.. (N: a subnet no
    interface uses), removed (namespaces, switch, hosts files) on exit."""
    names = names or [f"{prefix}{i + 1}" for i in range(count)]
    assert len(names) == count, f"{count} hosts, {len(names)} names"
    if os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("ip", "nsenter", "unshare")):
        pytest.skip("virtual hosts need root, iproute2 (ip) and util-linux (nsenter, unshare)")
    tag = f"{os.getpid()}x{next(_networks)}"
    switch = f"dkbr{tag}"
    with _network_lock():  # make test runs 2 pytest workers: each picks a subnet in turn
        _remove_stale_switches()
        subnet = _free_subnet()
        try:
            _make_switch(switch, f"{subnet}.1")
        except subprocess.CalledProcessError as err:
            pytest.skip(f"cannot create a virtual network here: {err.stderr.decode().strip()}")
    hosts = [
        VirtualHost(
            f"ddpk-{tag}-{i}",
            name,
            f"{subnet}.{i + 2}",
            f"dkv{tag}{i}",
            f"{subnet}.1",
            bridge=switch,
        )
        for i, name in enumerate(names)
    ]
    try:
        for host in hosts:
            _plug(host, switch, host.cable, hosts)
        yield hosts
    finally:
        for host in hosts:  # deleting a namespace deletes its end of the veth, and the pair
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)
            shutil.rmtree(f"/etc/netns/{host.namespace}", ignore_errors=True)
        subprocess.run(["ip", "link", "del", switch], capture_output=True)


def add_host(network: VirtualHost, name: str, number: int) -> VirtualHost:
    """One more host on ``network``'s switch (``network``: a host of :func:`virtual_hosts`),
    named ``name``, at address ``.number`` of its subnet (one no host of it has had: a
    machine that comes back elsewhere). Its hosts file names only itself; remove it with
    :func:`remove_host` (:func:`virtual_hosts` removes only its own hosts).
    """
    tag = network.namespace.removeprefix("ddpk-").rpartition("-")[0]
    subnet = network.switch.rpartition(".")[0]
    host = VirtualHost(f"ddpk-{tag}-{number}", name, f"{subnet}.{number}", f"dkv{tag}{number}",
                       network.switch, bridge=network.bridge)  # fmt: skip
    try:
        _plug(host, host.bridge, host.cable, [host])
    except BaseException:
        remove_host(host)
        raise
    return host


def remove_host(host: VirtualHost) -> None:
    """Its namespace (and so its link) and its hosts file; a process inside keeps running."""
    subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)
    subprocess.run(["ip", "link", "del", host.cable], capture_output=True)  # if never moved
    shutil.rmtree(f"/etc/netns/{host.namespace}", ignore_errors=True)


def _remove_stale_switches() -> None:
    """Switches and namespaces left by test processes that no longer run."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for tag, pid in set(re.findall(r"\bdkbr((\d+)(?:x\d+)?)\b", links)):
        if _running(int(pid)):
            continue
        for namespace in re.findall(rf"\b(ddpk-{tag}-\d+)\b", namespaces):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
            shutil.rmtree(f"/etc/netns/{namespace}", ignore_errors=True)
        subprocess.run(["ip", "link", "del", f"dkbr{tag}"], capture_output=True)


@contextlib.contextmanager
def _network_lock() -> Iterator[None]:
    """One test process at a time between looking for a free subnet and taking it."""
    with open("/run/lock/ddpkit-test-networks.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _free_subnet() -> str:
    """``10.250.N`` for the first N from 8 that no interface here has an address in."""
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True)
    taken = set(re.findall(r"inet 10\.250\.(\d+)\.", used.stdout))
    return f"10.250.{next(n for n in range(8, 250) if str(n) not in taken)}"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _make_switch(switch: str, address: str) -> None:
    ip("link", "add", switch, "type", "bridge")
    ip("addr", "add", f"{address}/24", "dev", switch)
    ip("link", "set", switch, "up")


def _plug(host: VirtualHost, switch: str, cable: str, everyone: list[VirtualHost]) -> None:
    ip("netns", "add", host.namespace)
    ip("link", "add", cable, "type", "veth", "peer", "name", f"{cable}p")
    ip("link", "set", cable, "master", switch)
    ip("link", "set", cable, "up")
    ip("link", "set", f"{cable}p", "netns", host.namespace)
    inside = ["-n", host.namespace]
    ip(*inside, "link", "set", f"{cable}p", "name", host.interface)
    ip(*inside, "addr", "add", f"{host.address}/24", "dev", host.interface)
    ip(*inside, "link", "set", host.interface, "up")
    ip(*inside, "link", "set", "lo", "up")
    folder = Path("/etc/netns") / host.namespace
    folder.mkdir(parents=True, exist_ok=True)
    names = "".join(f"{other.address} {other.name}\n" for other in everyone)
    (folder / "hosts").write_text(f"127.0.0.1 localhost\n{host.switch} switch\n{names}")
