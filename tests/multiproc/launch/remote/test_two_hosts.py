"""Two hosts for real: network namespaces on a virtual switch, one launcher in each.

The hosts are this test's own namespaces (:mod:`helpers.netns`; their addresses exist only
inside them); nothing outside them is contacted. Skipped with the reason where namespaces
cannot be made (not root, no iproute2).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from helpers.launch_helpers import REPO, metric_lines, wine_on_one_host
from helpers.netns import VirtualHost, virtual_hosts

pytestmark = pytest.mark.multiproc


@pytest.fixture
def two_hosts() -> Iterator[list[VirtualHost]]:
    with virtual_hosts(2) as hosts:
        yield hosts


def launcher(host: VirtualHost, master: VirtualHost, node_rank: int) -> subprocess.Popen[str]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": host.interface}
    command = host.command(
        sys.executable, "-m", "ddpkit", "run", "--nproc", "1", "--nnodes", "2",
        "--node-rank", str(node_rank), "--master", f"{master.address}:29500",
        "--local-addr", host.address, "examples/wine.py", "--epochs", "5",
    )  # fmt: skip
    return subprocess.Popen(command, cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def test_wine_trains_across_two_hosts_like_on_one(two_hosts: list[VirtualHost]) -> None:
    nodes = [launcher(host, two_hosts[0], rank) for rank, host in enumerate(two_hosts)]
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
