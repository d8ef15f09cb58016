"""``ddpkit run --hosts`` against real ssh servers: Debian's OpenSSH in network namespaces
as hosts (:mod:`helpers.sshd`), root logging in by a key the test made.

One command trains on two hosts as one host does; an unreachable host or a refused key is
named before anything starts; a launcher killed with SIGKILL leaves nothing running on any
host; an elastic job goes on when a host is lost.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ddpkit.checkpoint import load_checkpoint
from helpers.jobs import children
from helpers.launch_helpers import REPO, metric_lines, processes_running
from helpers.netns import VirtualHost, virtual_hosts
from helpers.sshd import ssh_servers

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[VirtualHost], Path]]:
    """Three hosts with sshd, and the ssh config file that reaches them by name."""
    folder = tmp_path_factory.mktemp("ssh")
    with virtual_hosts(3, prefix="sshhost") as made, ssh_servers(made, folder) as config:
        yield made, config


def ddpkit_hosts(config: Path, *argv: str, **popen: object) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "ddpkit", "run", "--ssh-config", str(config),
               "--env", "GLOO_SOCKET_IFNAME=eth0", *argv]  # fmt: skip
    return subprocess.Popen(
        command, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen
    )  # type: ignore[call-overload]


def endless_job(
    config: Path, made: list[VirtualHost], marker: str, **popen: object
) -> subprocess.Popen[str]:
    """The wine example on the first two hosts, until stopped; ``marker``: its checkpoint
    folder, in every process's command line there."""
    two = f"{made[0].name},{made[1].name}"
    return ddpkit_hosts(config, "--hosts", two, "examples/wine.py", "--epochs", "100000",
                        "--checkpoint-dir", marker, **popen)  # fmt: skip


def test_two_hosts_of_two_train_as_one_host_of_four(
    hosts: tuple[list[VirtualHost], Path], tmp_path: Path
) -> None:
    made, config = hosts
    spread = f"{made[0].name}:2,{made[1].name}:2"
    wine = ["examples/wine.py", "--epochs", "3", "--checkpoint-dir"]
    job = ddpkit_hosts(config, "--hosts", spread, *wine, str(tmp_path / "hosts"))
    out = job.communicate(timeout=240)[0]
    assert job.returncode == 0, out
    assert "world size 4 (2 processes per node x 2 nodes)" in out, out
    assert f"[{made[0].name}] [rank0] epoch 3/3" in out, out  # labelled with its host
    one = subprocess.run([sys.executable, "-m", "ddpkit", "run", "--nproc", "4", *wine,
                          str(tmp_path / "one")],
                         cwd=REPO, capture_output=True, text=True, timeout=240)  # fmt: skip
    lines = [line.split("] ", 1)[-1] for line in out.splitlines()]
    assert metric_lines("\n".join(lines)) == metric_lines(one.stdout) != [], (out, one.stdout)
    # bit for bit: the final weights rank 0 saved on the first host and on the one host
    over_ssh, alone = (load_checkpoint(tmp_path / run / "epoch_000003.pt")["model"]
                       for run in ("hosts", "one"))  # fmt: skip
    assert over_ssh.keys() == alone.keys()
    assert all(torch.equal(over_ssh[name], alone[name]) for name in alone)


def test_no_process_on_either_side_shows_a_forwarded_secret_in_its_command_line(
    hosts: tuple[list[VirtualHost], Path], tmp_path: Path
) -> None:
    """A secret forwarded by its prefix (WANDB_) and one named by a bare ``--env`` reach every
    host's job through its environment; no command line on this machine or any host (one
    process table here: network namespaces share it) shows either while the job runs."""
    made, config = hosts
    secrets = {
        "WANDB_API_KEY": f"wandb-{os.urandom(8).hex()}",
        "HF_TOKEN": f"hf-{os.urandom(8).hex()}",
    }
    marker = str(tmp_path / "secret-run")
    job = ddpkit_hosts(config, "--env", "HF_TOKEN", "--hosts", f"{made[0].name},{made[1].name}",
                       "examples/wine.py", "--epochs", "100000", "--checkpoint-dir", marker,
                       env={**os.environ, **secrets})  # fmt: skip
    try:
        _wait_for_line(job, "epoch 1/")
        shown = {pid: line for pid, line in _every_cmdline().items()
                 if any(value in line for value in secrets.values())}  # fmt: skip
        assert not shown, shown
        for host in made[:2]:  # each host's job has them, in its environment only
            environ = Path(f"/proc/{_launcher_on(host, marker)}/environ").read_bytes()
            assert all(f"{k}={v}".encode() in environ.split(b"\0") for k, v in secrets.items())
    finally:
        job.send_signal(signal.SIGINT)
        job.communicate(timeout=120)


def _every_cmdline() -> dict[int, str]:
    """Every process's command line, as ps shows it."""
    lines = {}
    for entry in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines[int(entry.parent.name)] = (
                entry.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
        except OSError:  # gone meanwhile
            continue
    return lines


def test_an_unreachable_host_or_a_refused_key_is_named_and_nothing_starts(
    hosts: tuple[list[VirtualHost], Path], tmp_path: Path
) -> None:
    made, config = hosts
    subnet = made[0].address.rsplit(".", 1)[0]
    extra = tmp_path / "ssh_config"  # the first value ssh finds wins: these come before *
    extra.write_text(
        f"Host ghost\n  HostName {subnet}.250\nHost stranger\n  HostName "
        f"{made[2].address}\n  User ddpkit-no-such-user\n" + config.read_text()
    )
    marker = str(tmp_path / "never-started")
    start = time.monotonic()
    job = ddpkit_hosts(extra, "--hosts", f"{made[0].name},ghost,stranger", "examples/wine.py",
                       "--checkpoint-dir", marker)  # fmt: skip
    out = job.communicate(timeout=60)[0]
    took = time.monotonic() - start
    assert job.returncode == 2, out
    assert "host ghost: ssh cannot log in" in out and "host stranger: ssh cannot log in" in out
    assert "Permission denied" in out and f"host {made[0].name}" not in out, out
    # ssh gave up on its own connect timeout (5 s): nothing waited for the answers' deadline (65 s)
    assert took < 45, f"named after {took:.1f} s"
    assert not processes_running(marker) and not Path(marker).exists()


def test_a_bad_flag_value_or_a_missing_module_is_refused_and_nothing_starts(
    hosts: tuple[list[VirtualHost], Path], tmp_path: Path
) -> None:
    """This machine reads a --hosts command line without torch's parser; each host's own
    ``ddpkit run`` refuses what it would refuse here, before anything starts."""
    made, config = hosts
    two = f"{made[0].name},{made[1].name}"
    marker = str(tmp_path / "never-started")
    bad = ddpkit_hosts(config, "--hosts", two, "--max-restarts", "many", "examples/wine.py",
                       "--checkpoint-dir", marker)  # fmt: skip
    out = bad.communicate(timeout=60)[0]
    assert bad.returncode == 2 and "argument --max-restarts/--max_restarts: invalid int" in out
    assert f"[{made[1].name}]" in out, out  # said by the hosts
    missing = ddpkit_hosts(config, "--hosts", two, "-m", "no_such_package.train")
    out = missing.communicate(timeout=60)[0]
    assert missing.returncode == 2, out
    for host in made[:2]:
        assert f"host {host.name}: no_such_package.train is not a module its Python" in out, out
    assert not processes_running(marker) and not Path(marker).exists()


def test_a_launcher_killed_with_sigkill_leaves_nothing_on_any_host(
    hosts: tuple[list[VirtualHost], Path], tmp_path: Path
) -> None:
    made, config = hosts
    marker = str(tmp_path / "killed-run")
    job = endless_job(config, made, marker, start_new_session=True)
    _wait_for_line(job, "epoch 1/")
    os.kill(job.pid, signal.SIGKILL)  # the launcher alone, as `kill -9 PID`
    deadline = time.monotonic() + 60
    while processes_running(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_running(marker), "a host's job outlived its launcher"


def test_ctrl_c_stops_every_host_after_its_checkpoint(
    hosts: tuple[list[VirtualHost], Path], tmp_path: Path
) -> None:
    """Ctrl-C here: every host's workers save where they were and stop (exit 130); the file
    rank 0 saved holds that step, and the same command resumes from it on both hosts."""
    made, config = hosts
    marker = str(tmp_path / "interrupted-run")
    job = endless_job(config, made, marker)
    seen = _wait_for_line(job, "epoch 2/")
    job.send_signal(signal.SIGINT)
    out = seen + job.communicate(timeout=120)[0]
    assert job.returncode == 130 and "got SIGINT; all workers were stopped" in out, out
    for host in made[:2]:  # each host's workers stopped where they were, their lines relayed
        assert re.search(rf"\[{host.name}\] .*stopped by SIGTERM", out), out
    saved = re.search(r"stopped by SIGTERM at (?:epoch \d+, step (\d+)|the end of epoch (\d+)) "
                      r"after saving (\S+);", out)  # fmt: skip
    assert saved, out
    state = load_checkpoint(saved[3])  # what rank 0 saved holds the position it said
    assert state["step"] == int(saved[1]) if saved[1] else state["epoch"] == int(saved[2])
    assert not processes_running(marker)
    until = str(state["step"] + 2)
    two = f"{made[0].name},{made[1].name}"
    again = ddpkit_hosts(
        config,
        "--hosts",
        two,
        "examples/wine.py",
        "--epochs",
        "100000",
        "--checkpoint-dir",
        marker,
        env={**os.environ, "DDPKIT_MAX_STEPS": until},
    )
    resumed = again.communicate(timeout=180)[0]
    assert again.returncode == 0, resumed
    assert f"resumed from {saved[3]}" in resumed, resumed
    assert f"stopped after {until} optimizer steps" in resumed, resumed


def test_a_lost_connection_stops_that_hosts_job_and_then_every_host(
    hosts: tuple[list[VirtualHost], Path], tmp_path: Path
) -> None:
    made, config = hosts
    marker = str(tmp_path / "cut-run")
    job = endless_job(config, made, marker)
    seen = _wait_for_line(job, "epoch 1/")
    [client] = [pid for pid in children(job.pid) if _cmdline(pid)[:1] == ["ssh"]
                and made[1].name in _cmdline(pid)]  # fmt: skip
    os.kill(client, signal.SIGKILL)  # as a network that drops: the server sees it close
    out = seen + job.communicate(timeout=120)[0]
    assert job.returncode != 0 and f"host {made[1].name} failed" in out, out
    deadline = time.monotonic() + 60
    while processes_running(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_running(marker), "a job outlived its connection"


def test_a_host_that_cannot_reach_the_first_is_named(
    hosts: tuple[list[VirtualHost], Path],
) -> None:
    made, config = hosts
    route = ["ip", "netns", "exec", made[1].namespace, "ip", "route"]
    subprocess.run([*route, "add", "blackhole", f"{made[0].address}/32"], check=True)
    try:
        two = f"{made[0].name},{made[1].name}"
        job = ddpkit_hosts(config, "--hosts", two, "examples/wine.py", "--epochs", "1")
        out = job.communicate(timeout=60)[0]
    finally:
        subprocess.run([*route, "del", "blackhole", f"{made[0].address}/32"], check=True)
    assert job.returncode == 2, out
    assert f"host {made[1].name}: cannot reach {made[0].name}:29500, where the nodes meet" in out


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def test_an_elastic_job_loses_a_host_and_goes_on(
    hosts: tuple[list[VirtualHost], Path], tmp_path: Path
) -> None:
    made, config = hosts
    marker = str(tmp_path / "elastic-run")
    job = ddpkit_hosts(config, "--hosts", ",".join(h.name for h in made), "--nnodes", "2:3",
                       "--max-restarts", "2", "examples/wine.py", "--epochs", "40",
                       "--checkpoint-dir", marker)  # fmt: skip
    seen = _wait_for_line(job, "epoch 2/")
    lost = _launcher_on(made[2], marker)
    os.kill(lost, signal.SIGKILL)  # the third host's launcher and its workers' lifeline go
    out = seen + job.communicate(timeout=240)[0]
    assert job.returncode == 0, out
    assert f"host {made[2].name} left" in out, out
    assert "epoch 40/40" in out and "(1 process per node x 2 nodes)" in out, out
    # The two hosts left went on from the newest checkpoint the three had written, and
    # finished the run from there (read from the checkpoints, not from the lines).
    resumed = re.search(r"resumed from (\S+\.pt)", out)
    assert resumed, out
    start, final = load_checkpoint(resumed[1]), load_checkpoint(Path(marker) / "epoch_000040.pt")
    assert 2 <= start["epoch"] < 40 and final["epoch"] == 40, (start["epoch"], final["epoch"])
    assert final["step"] > start["step"]
    assert final["history"][: len(start["history"])] == start["history"]  # the same run, on


def _wait_for_line(job: subprocess.Popen[str], text: str, timeout: float = 180) -> str:
    """The output up to the first line holding ``text``; the job goes on."""
    assert job.stdout is not None
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in job.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if text in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout), "".join(seen)
    return "".join(seen)


def _launcher_on(host: VirtualHost, marker: str) -> int:
    """The pid of the ``ddpkit run`` that ssh started on ``host``."""
    for pid in processes_running(marker):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        launcher = cmdline[1:4] == [b"-m", b"ddpkit", b"run"]
        if launcher and b"DDPKIT_STDIN_LIFELINE=1" in environ and _on(pid, host):
            return pid
    raise AssertionError(f"no ddpkit run of {marker} on {host.name}")


def _on(pid: int, host: VirtualHost) -> bool:
    """Whether process ``pid`` runs in ``host``'s network namespace."""
    mine = os.stat(f"/proc/{pid}/ns/net").st_ino
    return mine == os.stat(f"/run/netns/{host.namespace}").st_ino
