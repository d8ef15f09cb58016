"""**Experimental** ReplicaGroups on separate hosts: network namespaces on a virtual switch
(:mod:`helpers.netns`), a group of 2 FSDP processes on each of two hosts, the lighthouse on a
third. Each group is started as a user there would start it (``ddpkit run --nproc 2``, no
GLOO_SOCKET_IFNAME), so its own store stays on the host's loopback while the groups meet
over the network. One host's processes are all killed with -9 (the host is lost); the other
group trains on alone; the lost group is started again, heals over the network from the
live one, and both end with identical weights, every sample trained once an epoch.

Skipped with the reason where namespaces cannot be made (not root, no iproute2).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.jobs import kill_9, wait_until, workers_of
from helpers.netns import VirtualHost, virtual_hosts
from helpers.replica_groups import (
    EPOCHS,
    Group,
    each_sample_once,
    same_weights,
    start_lighthouse,
    steps_agree,
    unrecorded,
)

torchft = pytest.importorskip("torchft", reason="pip install 'ddpkit[ft]'")
pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(420)]


@pytest.fixture
def hosts() -> Iterator[list[VirtualHost]]:
    with virtual_hosts(3, prefix="dkft") as made:
        yield made


@pytest.fixture
def lighthouse(hosts: list[VirtualHost]) -> Iterator[str]:
    """The lighthouse on the third host, at that host's address."""
    server, address = start_lighthouse(host=hosts[2])
    yield address
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()


def test_a_host_lost_leaves_the_other_group_training_and_its_group_heals_over_the_network(
    hosts: list[VirtualHost], lighthouse: str, tmp_path: Path
) -> None:
    first, second, beacon = hosts
    assert beacon.address in lighthouse  # the groups reach it over the switch
    hold, go = tmp_path / "hold", tmp_path / "go"  # group 0 waits at hold until group 1 is back
    fsdp = ("--strategy", "fsdp", "--timeout", "60", "--start-after", str(go))
    survivor = Group(0, lighthouse, tmp_path, "--hold", str(hold), *fsdp, nproc=2, host=first)
    doomed = Group(1, lighthouse, tmp_path, *fsdp, nproc=2, host=second)
    started = lambda g: "fault-tolerant across groups" in g.text()  # noqa: E731
    wait_until(lambda: started(survivor) and started(doomed), 120, "both groups started")
    go.touch()
    wait_until(lambda: sum(line["groups"] == 2 for line in doomed.trained()) >= 6, 90,
               "group 1 training beside group 0 across the hosts, a quorum of 2")  # fmt: skip
    kill_9(doomed.process, workers_of(doomed.process.pid))  # every process of the host
    last_step = lambda g: max(line["step"] for line in g.trained())  # noqa: E731
    at_kill = last_step(survivor)
    hold.write_text(str(at_kill + 6))
    wait_until(lambda: last_step(survivor) >= at_kill + 6, 120, "group 0 training alone")
    assert "group 1 left" in survivor.text(), survivor.text()[-3000:]
    back = Group(1, lighthouse, tmp_path, *fsdp, nproc=2, host=second)
    wait_until(lambda: started(back), 90, "group 1 started again on its host")
    Path(f"{hold}.go").touch()
    survivor.finish(timeout=150)
    back.finish(timeout=60)
    steps = survivor.steps()
    assert steps == sorted(steps), steps  # group 0 never went back
    healed = re.search(r"healed at step \d+ \(was at step 0\): the run's state from the group "
                       r"at place \d of the quorum, on (\S+), over ([\d.]+) \((\w+)\)",
                       back.text())  # fmt: skip
    assert healed, back.text()[-3000:]
    # From the other host, over the host's network interface, not loopback
    assert (healed[2], healed[3]) == (second.address, second.interface), healed[0]
    assert same_weights(survivor.weights(), back.weights())
    steps_agree(survivor)
    each_sample_once([survivor, back], range(EPOCHS), lost_in=unrecorded(survivor, back, 2))
