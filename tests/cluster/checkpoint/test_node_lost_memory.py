"""A whole node lost costs no completed step: its ranks resume from the copies of their
snapshots that the next node kept in its memory, and the run ends bit-identical to an
uninterrupted one.

Two network-namespace hosts run ``ddpkit run --nnodes 2 --nproc 2 --max-restarts 2`` (torch's
c10d rendezvous) of tests/scripts/memory_restart.py. After step 57 every rank pauses; host 1's
launcher and all under it are killed with SIGKILL (its memory folder is lost with it: the
replacement launcher makes a new one); the others go on, fail on the lost peers and are
restarted by torch's agent; a replacement launcher on host 1 joins, and its ranks take their
step-57 snapshots from host 0's copies. The checkpoint folder is written only at the end, so a
resume from storage would start over. The reference is the same script, 4 workers on one host
(the same world size, ranks and ring order).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ddpkit.checkpoint.memory import SnapshotRing
from helpers.jobs import killed_at_the_end, wait_until
from helpers.launch_helpers import REPO, SCRIPTS, ddpkit_cli
from helpers.netns import VirtualHost, virtual_hosts

pytestmark = pytest.mark.cluster

PAUSE_AT = 57  # epoch 2, batch 17
RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"


def launcher(hosts: list[VirtualHost], index: int, root: Path, log: str, pause: Path
             ) -> subprocess.Popen[str]:  # fmt: skip
    host = hosts[index]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": host.interface,
           "MEMORY_RESTART_PAUSE": f"{PAUSE_AT}:{pause}"}  # fmt: skip
    command = host.command(
        sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "--nnodes", "2",
        "--rdzv-endpoint", f"{hosts[0].address}:29400", "--rdzv-id", "node-lost",
        "--max-restarts", "2", "--rdzv-conf", RDZV_CONF, "--local-addr", host.address,
        str(SCRIPTS / "memory_restart.py"), str(root / "out"),
    )  # fmt: skip
    return subprocess.Popen(command, cwd=REPO, env=env, text=True, start_new_session=True,
                            stdout=(root / log).open("w"), stderr=subprocess.STDOUT)  # fmt: skip


def copies_kept(step: int, since: float) -> bool:
    """Whether a launch folder made since ``since`` keeps ranks 2 and 3's copies of ``step``
    (host 0's: the copies of host 1's ranks; /dev/shm is shared by the virtual hosts)."""
    for folder in Path("/dev/shm").glob("ddpkit-launch-*"):
        with contextlib.suppress(OSError):
            if folder.stat().st_mtime < since:
                continue
            kept = [SnapshotRing(folder, f"fit1.kept{rank}").whole() for rank in (2, 3)]
            if all(any(key.startswith(f"{step}:") for key in found) for found in kept):
                return True
    return False


@pytest.mark.timeout(600)
def test_a_node_killed_resumes_from_the_next_nodes_copy_with_no_step_lost(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    done = ddpkit_cli("run", "--nproc", "4", "--max-restarts", "1",
                      str(SCRIPTS / "memory_restart.py"), str(reference), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    pause = tmp_path / "pause"
    started = time.time()
    with virtual_hosts(2) as hosts:
        agents = [launcher(hosts, i, tmp_path, f"host{i}.log", pause) for i in range(2)]
        with killed_at_the_end(agents):
            wait_until(
                lambda: len(list(tmp_path.glob("pause.rank*"))) == 4, 180, "every rank at 57"
            )
            wait_until(lambda: copies_kept(PAUSE_AT, started), 60, "step 57's copies on host 0")
            os.killpg(agents[1].pid, signal.SIGKILL)  # host 1's launcher and all under it
            agents[1].wait(timeout=30)
            pause.touch()  # host 0's ranks go on: their next step finds host 1 gone
            first = tmp_path / "host0.log"
            lost = time.monotonic()
            # The replacement joins torch's rendezvous at once: host 0's agent restarts its
            # workers for it (a node waiting) or for their failure on the lost peers,
            # whichever it sees first; either way the next round has both.
            agents[1] = launcher(hosts, 1, tmp_path, "host1-again.log", pause)
            wait_until(lambda: "resumed from memory" in first.read_text(), 180, "the resume")
            resumed = time.monotonic()
            outcomes = [agent.wait(timeout=300) for agent in agents]
    output = (tmp_path / "host0.log").read_text()
    print(
        f"node killed -> resumed from memory with a replacement started at once: "
        f"{resumed - lost:.1f} s"
    )
    assert outcomes == [0, 0], output[-4000:]
    said = (f"resumed from memory at step {PAUSE_AT} (epoch 2 batch 17): 0 completed step(s) "
            "lost, 0.0 s read from storage, ranks 2,3 from the next node's copy")  # fmt: skip
    assert said in output, output[-4000:]
    final = torch.load(tmp_path / "out" / "final.pt", weights_only=True)
    expected = torch.load(reference / "final.pt", weights_only=True)
    for name, tensor in expected["weights"].items():
        assert torch.equal(final["weights"][name], tensor), name  # bit for bit
    losses = [epoch["loss"] for epoch in final["history"]]
    assert losses == [epoch["loss"] for epoch in expected["history"]]
