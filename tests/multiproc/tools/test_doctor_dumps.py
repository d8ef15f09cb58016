"""``ddpkit doctor --dumps``: the Flight Recorder dumps of a plain torchrun job (no ddpkit
in it), explained after the fact."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launch_helpers import REPO, SCRIPTS, ddpkit_cli

pytestmark = pytest.mark.multiproc


@pytest.mark.timeout(120)
def test_the_dumps_of_a_plain_torchrun_job_name_the_rank_and_the_collective(tmp_path: Path) -> None:
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000", "GLOO_SOCKET_IFNAME": "lo",
           "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "trace_rank_")}  # fmt: skip
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                "2", str(SCRIPTS / "plain_torchrun_dumps.py")]  # fmt: skip
    job = subprocess.run(torchrun, cwd=REPO, env=env, capture_output=True, text=True, timeout=90)
    assert job.returncode == 0, job.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace_rank_0", "trace_rank_1"]
    done = ddpkit_cli("doctor", "--dumps", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"2 dump(s) of 2 rank(s) in {tmp_path}\n")
    assert re.search(
        r"^collectives: rank 1 never issued all_reduce #(\d+) of the default group \(3 float32\); "
        r"rank 0 was in it, called from plain_torchrun_dumps\.py:\d+ \(main\); rank 1's last "
        r"collective there was #\d+ at plain_torchrun_dumps\.py:\d+ \(main\)$",
        done.stdout, re.MULTILINE,
    ), done.stdout  # fmt: skip
    assert f"torchfrtrace {tmp_path}" in done.stdout
