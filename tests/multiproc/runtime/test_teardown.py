"""Leaving the process group ends the process, whatever gloo's threads are doing then: a real
gloo group, a DDP model and a collective's tensor freed by gloo at the moment of the teardown
(tests/scripts/exit_while_gloo_frees.py, which makes that race certain)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from helpers.launch_helpers import REPO, SCRIPTS

pytestmark = pytest.mark.multiproc


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_teardown_ends_while_gloo_frees_a_tensor_with_its_work_lock_held() -> None:
    """Before, one of two outcomes: a hang in ``~ProcessGroupGloo`` (the DDP reducer, freed
    with the GIL held, was the group's last owner: 1 in 15 two-rank jobs ending with a
    barrier), or exit 134 at interpreter exit (torch.distributed.nn.functional, imported by
    DDP after the group existed, kept it alive until then)."""
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))  # fmt: skip
    job = subprocess.run([sys.executable, str(SCRIPTS / "exit_while_gloo_frees.py")], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert job.returncode == 0, job.stderr[-3000:]
    assert "left the group" in job.stdout
