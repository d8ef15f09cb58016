"""Two hosts for real: network namespaces joined by a veth pair, one launcher in each.

The hosts are this test's own namespaces (10.250.7.1 and 10.250.7.2 exist only inside
them); nothing outside them is contacted. Skipped with the reason where namespaces cannot be
made (not root, no iproute2).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from helpers.launch_helpers import REPO, metric_lines, wine_on_one_host

pytestmark = pytest.mark.multiproc

ADDRESSES = ("10.250.7.1", "10.250.7.2")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_hosts() -> Iterator[list[tuple[str, str, str]]]:
    """[(namespace, interface, address), ...] for two hosts on one virtual wire."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2 (`ip`)")
    tag = uuid.uuid4().hex[:6]
    hosts = [(f"ddpk-{tag}-{i}", f"dk{tag}{i}", ADDRESSES[i]) for i in (0, 1)]
    try:
        for namespace, _, _ in hosts:
            ip("netns", "add", namespace)
    except subprocess.CalledProcessError as err:
        pytest.skip(f"cannot create network namespaces here: {err.stderr.decode().strip()}")
    try:
        ip("link", "add", hosts[0][1], "type", "veth", "peer", "name", hosts[1][1])
        for namespace, interface, address in hosts:
            ip("link", "set", interface, "netns", namespace)
            ip("-n", namespace, "addr", "add", f"{address}/24", "dev", interface)
            ip("-n", namespace, "link", "set", interface, "up")
            ip("-n", namespace, "link", "set", "lo", "up")
        yield hosts
    finally:
        for namespace, _, _ in hosts:  # deleting a namespace deletes its end of the veth
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)


def launcher(host: tuple[str, str, str], node_rank: int, epochs: int) -> subprocess.Popen[str]:
    namespace, interface, address = host
    env = {**os.environ, "GLOO_SOCKET_IFNAME": interface}
    command = [
        "ip", "netns", "exec", namespace, sys.executable, "-m", "ddpkit", "run",
        "--nproc", "1", "--nnodes", "2", "--node-rank", str(node_rank),
        "--master", f"{ADDRESSES[0]}:29500", "--local-addr", address,
        "examples/wine.py", "--epochs", str(epochs),
    ]  # fmt: skip
    return subprocess.Popen(command, cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def test_wine_trains_across_two_hosts_like_on_one(two_hosts: list[tuple[str, str, str]]) -> None:
    nodes = [launcher(host, rank, epochs=5) for rank, host in enumerate(two_hosts)]
    try:
        outputs = [node.communicate(timeout=120) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], outputs
    two_host_log = outputs[0][0]
    assert "world size 2 (1 process per node x 2 nodes)" in two_host_log
    # Same ranks, data order and reductions: the per-epoch losses and accuracy must agree.
    assert metric_lines(two_host_log) == metric_lines(wine_on_one_host(epochs=5))
    assert len(metric_lines(two_host_log)) == 6
