"""`ddpkit doctor --nodes` across three hosts for real: network namespaces on a virtual switch,
one `ddpkit run` in each, as a user runs it on each host of a job; then one host's link is
shaped to 100 Mbit/s with tc (both ways) and doctor must name that host.

Skipped with the reason where namespaces or tc are missing (not root, no iproute2).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from helpers.launch_helpers import REPO, worker_lines
from helpers.netns import VirtualHost, virtual_hosts

pytestmark = [pytest.mark.multiproc, pytest.mark.serial]  # timed: runs alone (make test)


def doctor_on(hosts: list[VirtualHost], node_rank: int) -> subprocess.Popen[str]:
    host = hosts[node_rank]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": host.interface}
    command = host.command(
        sys.executable, "-m", "ddpkit", "run", "--nproc", "1", "--nnodes", str(len(hosts)),
        "--node-rank", str(node_rank), "--master", f"{hosts[0].address}:29500",
        "--local-addr", host.address, "-m", "ddpkit", "doctor", "--nodes", "--link-mib", "4",
    )  # fmt: skip
    return subprocess.Popen(command, cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def doctor_everywhere(hosts: list[VirtualHost]) -> str:
    """Rank 0's report (its host's launcher prints it)."""
    nodes = [doctor_on(hosts, rank) for rank in range(len(hosts))]
    try:
        outputs = [node.communicate(timeout=150) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0] * len(hosts), outputs
    return outputs[0][0]


@pytest.mark.timeout(400)
def test_doctor_nodes_passes_healthy_links_and_names_a_slowed_host() -> None:
    if shutil.which("tc") is None:
        pytest.skip("tc (iproute2) is not installed")
    with virtual_hosts(3) as hosts:
        healthy = doctor_everywhere(hosts)
        assert "links between 3 hosts (gloo, 4 MiB messages)" in healthy
        assert healthy.count(" <-> ") == 3 and "PASS every link" in healthy, healthy
        hosts[2].limit_rate("100mbit")
        report = doctor_everywhere(hosts)
    failures = [line for line in worker_lines(report) if line.startswith("FAIL")]
    slowed = f"slow host {hosts[2].name} ({hosts[2].address})"
    assert failures == [line for line in failures if slowed in line]
    assert len(failures) == 1, report
    slow = float(failures[0].split("its links ")[1].split(" MB/s")[0])
    assert 6 < slow < 14  # 100 Mbit/s is 12.5 MB/s
