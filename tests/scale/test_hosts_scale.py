"""``ddpkit run --hosts`` at scale: 4 hosts (network namespaces with Debian's OpenSSH,
:mod:`helpers.sshd`) of N/4 ranks each train the tier's Trainer job as one host of N does,
every rank's counts alike, from one command on this machine.

``make test`` runs it at 8 ranks (4 hosts x 2); ``make scale`` at 16, 32 and 64 (4 x 16).
Skipped with the reason where namespaces or sshd cannot be had (not root, no apt-get).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.launch_helpers import REPO, ddpkit_cli
from helpers.netns import VirtualHost, virtual_hosts
from helpers.sshd import ssh_servers

SIZES = [int(n) for n in os.environ.get("SCALE_SIZES", "8").split(",") if n.strip()]
HOSTS = 4
JOB = str(REPO / "benchmarks" / "scale_cost_job.py")

pytestmark = [pytest.mark.multiproc, pytest.mark.scale, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[VirtualHost], Path]]:
    folder = tmp_path_factory.mktemp("ssh")
    with virtual_hosts(HOSTS, prefix="dksc") as made, ssh_servers(made, folder) as config:
        yield made, config


def counts(folder: Path) -> dict[int, dict[str, object]]:
    """Each rank's counts (scale_cost_job.py) in its steps and at its epochs' ends: less what
    differs by host (descriptors, threads, the store's keys) and the set-up's collectives
    (ranks on several hosts agree on one more thing before training)."""
    found: dict[int, dict[str, object]] = {}
    for path in folder.glob("rank*.json"):
        rank = json.loads(path.read_text())
        found[rank["rank"]] = {"steps": rank["steps"], "epochs": rank["epochs"]} | {
            f"{kind}:{name}": value
            for kind in ("calls", "sent")
            for name, value in rank[kind].items()
            if not name.startswith("setup:")
        }
    return found


@pytest.mark.parametrize("size", [n for n in SIZES if n % HOSTS == 0])
def test_four_hosts_train_as_one_host_of_the_same_size(
    size: int, hosts: tuple[list[VirtualHost], Path], tmp_path: Path
) -> None:
    made, config = hosts
    spread = ",".join(f"{host.name}:{size // HOSTS}" for host in made)
    for run in ("hosts", "one"):  # where each rank writes its counts
        (tmp_path / run).mkdir()
    started = time.monotonic()
    job = subprocess.run(
        [sys.executable, "-m", "ddpkit", "run", "--ssh-config", str(config), "--env",
         "GLOO_SOCKET_IFNAME=eth0", "--hosts", spread, JOB, str(tmp_path / "hosts"), "3"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    took = time.monotonic() - started
    out = job.stdout + job.stderr
    assert job.returncode == 0, out[-4000:]
    per_node = size // HOSTS
    plural = "process" if per_node == 1 else "processes"
    assert f"world size {size} ({per_node} {plural} per node x {HOSTS} nodes)" in out, out[-4000:]
    assert f"[{made[0].name}] [rank0] epoch 3/3" in out, out[-4000:]  # labelled with its host
    one = ddpkit_cli("run", "--nproc", str(size), JOB, str(tmp_path / "one"), "3", timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    over_ssh, alone = counts(tmp_path / "hosts"), counts(tmp_path / "one")
    assert sorted(over_ssh) == list(range(size)), sorted(over_ssh)
    assert over_ssh == alone  # steps, epochs, ddpkit's collectives and bytes: rank by rank
    print(f"{HOSTS} hosts x {per_node} over ssh: launched, trained 3 epochs, ended in "
          f"{took:.1f} s")  # fmt: skip
