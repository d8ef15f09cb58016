"""The one command ssh runs on each host of ``ddpkit run --hosts``
(``python -m ddpkit.launch.remote.entry``), driven as the launcher drives it: its order on
stdin, its probe's answer, then ``go`` and the job, with the environment it was sent and
never in a command line. (The whole path over a real sshd: tests/cluster/launch.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddpkit.launch.remote.hostfile import Host
from ddpkit.launch.remote.job import RemotePlan, Script
from ddpkit.launch.remote.order import ENTRY, PROBE_ANSWER
from helpers.launch_helpers import REPO

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(120)]

SECRET = "planted-secret-4f1c9e"
SHOW = """
import os, sys
print("token", os.environ.get("HF_TOKEN"), "lifeline", os.environ.get("DDPKIT_STDIN_LIFELINE"))
print("cmdline", open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode())
pid = os.getpid()
for _ in range(2):  # the launcher, or (warm workers) the server and the launcher
    pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    print("parent", open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode())
"""


def entry(order: bytes, then: bytes, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The entry point as ssh starts it on a host: in the login's folder, the order down its
    stdin, which stays open after ``go`` (its end would stop the job: the lifeline)."""
    process = subprocess.Popen([sys.executable, "-m", ENTRY], cwd=cwd, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(order + then)
    process.stdin.flush()
    if then != b"go\n":
        process.stdin.close()
    out, err = process.stdout.read(), process.stderr.read()  # type: ignore[union-attr]
    code = process.wait(timeout=100)
    if not process.stdin.closed:
        process.stdin.close()
    return subprocess.CompletedProcess([], code, out.decode(), err.decode())


def plan_in(folder: Path) -> RemotePlan:
    return RemotePlan([Host("127.0.0.1")], "1", 0, ["--standalone", "show.py"], cwd=str(folder))


def test_go_starts_ddpkit_run_in_the_jobs_folder_with_the_environment_it_was_sent(
    tmp_path: Path,
) -> None:
    (tmp_path / "show.py").write_text(SHOW)
    plan = plan_in(tmp_path)
    order = plan.order(0, Script("show.py"), {"HF_TOKEN": SECRET}).encode()
    done = entry(order, b"go\n", cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout.split(PROBE_ANSWER, 1)[1].splitlines()[0])
    assert answer["folder"] and answer["script"] and answer["port_free"], answer
    assert f"token {SECRET} lifeline 1" in done.stdout, done.stdout
    cmdlines = [line for line in done.stdout.splitlines() if "cmdline" in line or "parent" in line]
    assert len(cmdlines) == 3 and not any(SECRET in line for line in cmdlines), cmdlines
    # the entry became ddpkit run: the worker's parent, or its server's
    assert any("-m ddpkit run --nnodes 1" in line for line in cmdlines[1:]), cmdlines


def test_without_go_nothing_starts(tmp_path: Path) -> None:
    (tmp_path / "show.py").write_text(SHOW)
    order = plan_in(tmp_path).order(0, Script("show.py"), {}).encode()
    for then in (b"", b"stop\n"):  # the launcher gone, or another host not ready
        done = entry(order, then, cwd=REPO)
        assert done.returncode == 0 and "token" not in done.stdout, done.stdout + done.stderr


def test_a_missing_folder_or_script_is_answered_not_started(tmp_path: Path) -> None:
    gone = plan_in(tmp_path / "gone").order(0, Script("show.py"), {}).encode()
    done = entry(gone, b"go\n", REPO)  # told to go all the same: there is nowhere to start
    answer = json.loads(done.stdout.split(PROBE_ANSWER, 1)[1])
    assert answer["folder"] is False and "No such file" in answer["folder_error"], answer
    assert done.returncode == 2 and "ddpkit run" not in done.stdout + done.stderr, done
    missing = plan_in(tmp_path).order(0, Script("nope.py"), {}).encode()
    answer = json.loads(entry(missing, b"", REPO).stdout.split(PROBE_ANSWER, 1)[1])
    assert answer["folder"] is True and answer["script"] is False, answer


@pytest.mark.parametrize("order", [b"", b"not json\n", b'{"cwd": "/", "probe": 1}\n'])
def test_anything_but_an_order_is_refused_before_anything_runs(order: bytes) -> None:
    done = entry(order, b"go\n", cwd=REPO)
    assert done.returncode == 2 and PROBE_ANSWER not in done.stdout, done.stdout
    assert "was given no order it reads" in done.stderr, done.stderr
