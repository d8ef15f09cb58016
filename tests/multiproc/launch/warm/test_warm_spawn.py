"""ddpkit.spawn forks its workers from a warm server (torch imported once per session): each
launch still sees the caller's environment of that moment and its own rank, and killing the
caller outright still ends its workers. Run from a fresh interpreter, so its server is new."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.launch_helpers import REPO

pytestmark = pytest.mark.multiproc

SCRIPT = """\
import json, os, sys, time
import ddpkit

def seen(marker):
    preloaded = "torch._dynamo" in sys.modules  # before this function imported anything
    world = ddpkit.init(timeout=60)
    keys = ("CALLER_SETTING", "REMOVED_LATER", "RANK", "LOCAL_RANK", "OMP_NUM_THREADS")
    import numpy, torch
    return {"marker": marker, "preloaded": preloaded, "parent": os.getppid(), "rank": world.rank,
            "cwd": os.getcwd(), "threads": torch.get_num_threads(),
            "numpy": int(numpy.random.randint(1 << 30)), **{k: os.environ.get(k) for k in keys}}

def wait_forever(folder):
    with open(os.path.join(folder, f"worker-{os.environ['RANK']}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(300)

if __name__ == "__main__":
    if sys.argv[1] == "hang":
        ddpkit.spawn(wait_forever, 2, sys.argv[2])
    os.environ["REMOVED_LATER"] = "yes"
    for call in range(2):
        os.environ["CALLER_SETTING"] = f"call {call}"
        os.environ["OMP_NUM_THREADS"] = str(call + 1)  # the server's torch read the first
        os.chdir(sys.argv[2] if call else os.getcwd())
        print("RESULT", json.dumps(ddpkit.spawn(seen, 2, call)), flush=True)
        os.environ.pop("REMOVED_LATER", None)
    print("LAUNCHER", os.getpid())
"""


def run_script(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    script = tmp_path / "warm.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    # Output to files: a killed caller's workers would hold pipes open.
    out, err = (open(tmp_path / name, "w") for name in ("out.txt", "err.txt"))  # noqa: SIM115
    with out, err:
        return subprocess.Popen([sys.executable, str(script), *args], cwd=REPO, env=env,
                                stdout=out, stderr=err, text=True)  # fmt: skip


def test_each_launch_sees_the_callers_environment_and_cwd_of_that_moment(tmp_path: Path) -> None:
    process = run_script(tmp_path, "env", str(tmp_path))
    assert process.wait(timeout=150) == 0, (tmp_path / "err.txt").read_text()
    out = (tmp_path / "out.txt").read_text()
    results = [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("RESULT")]
    calls = [json.loads(result) for result in results]
    launcher = int(out.split("LAUNCHER ")[1])
    first, second = calls
    assert [w["rank"] for w in first] == [0, 1] == [w["RANK"] and int(w["RANK"]) for w in second]
    assert [w["LOCAL_RANK"] for w in second] == ["0", "1"]
    assert {w["CALLER_SETTING"] for w in first} == {"call 0"}
    assert {w["CALLER_SETTING"] for w in second} == {"call 1"}  # not the server's "call 0"
    assert {w["REMOVED_LATER"] for w in first} == {"yes"}
    assert {w["REMOVED_LATER"] for w in second} == {None}
    # The launch's OMP_NUM_THREADS, in the environment and in torch (the server's torch read
    # the first call's at import), and NumPy drawing anew in each forked worker
    assert [(w["OMP_NUM_THREADS"], w["threads"]) for w in first + second] == [
        ("1", 1), ("1", 1), ("2", 2), ("2", 2),
    ]  # fmt: skip
    assert len({w["numpy"] for w in first + second}) == 4
    assert {w["cwd"] for w in second} == {str(tmp_path)}
    # Forked from the server, torch already in place, not spawned by the launcher itself:
    assert all(w["preloaded"] and w["parent"] != launcher for w in first + second)


def test_killing_the_caller_outright_ends_its_forked_workers(tmp_path: Path) -> None:
    process = run_script(tmp_path, "hang", str(tmp_path))
    pid_files = [tmp_path / f"worker-{rank}.pid" for rank in (0, 1)]
    deadline = time.monotonic() + 120
    while not all(f.exists() and f.read_text() for f in pid_files):
        errors = (tmp_path / "err.txt").read_text()
        assert time.monotonic() < deadline and process.poll() is None, errors
        time.sleep(0.2)
    workers = [int(f.read_text()) for f in pid_files]
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in workers):
        assert time.monotonic() < deadline, f"workers {workers} outlived their launcher"
        time.sleep(0.2)


CTRL_C = """\
import os, signal, sys, time
import ddpkit

def catches_ctrl_c():
    try:
        signal.raise_signal(signal.SIGINT)
        time.sleep(2)
        return "not raised"
    except KeyboardInterrupt:
        return "caught"

if __name__ == "__main__":
    seen = [ddpkit.spawn(catches_ctrl_c, 2) for _ in range(int(sys.argv[1]))]
    print("SEEN", seen.count(["caught", "caught"]), len(seen), flush=True)
"""


@pytest.mark.timeout(300)
def test_a_warm_workers_ctrl_c_is_caught_every_time_under_load(tmp_path: Path) -> None:
    """Twenty launches in a row, each two workers forked from the warm server while a busy
    process loads a core (make test's other tests the other): every worker's SIGINT raises
    KeyboardInterrupt, as in a fresh interpreter (two fresh clones' make test once saw both
    ranks miss it)."""
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])]
    try:
        done = subprocess.run([sys.executable, str(script), "20"], cwd=REPO, timeout=280,
                              env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"},
                              capture_output=True, text=True)  # fmt: skip
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SEEN 20 20" in done.stdout, done.stdout + done.stderr[-3000:]
