"""Every way ranks can fail to meet ends in a clear, quick error (real sockets and files)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import ddpkit
from ddpkit import ConfigError, RendezvousError
from helpers import mp_workers
from helpers.launch_helpers import SCRIPTS

pytestmark = [pytest.mark.multiproc, pytest.mark.serial]  # timed: runs alone (make test)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def listening_socket() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield int(sock.getsockname()[1])
    sock.close()


def test_port_in_use_names_address_and_pid_quickly(torchrun_env, listening_socket: int) -> None:
    torchrun_env(rank=0, world_size=2, master_addr="127.0.0.1", master_port=listening_socket)
    start = time.monotonic()
    with pytest.raises(RendezvousError) as caught:
        ddpkit.init(join_timeout=30)
    assert time.monotonic() - start < 5
    assert f"127.0.0.1:{listening_socket} is in use (by pid {os.getpid()})" in str(caught.value)


def test_missing_ranks_are_named(torchrun_env) -> None:
    torchrun_env(rank=0, world_size=3, master_addr="127.0.0.1", master_port=free_port())
    start = time.monotonic()
    with pytest.raises(RendezvousError, match=r"ranks 1,2 did not join 127\.0\.0\.1:\d+ within 2 s "
                       r"\(1 of 3 joined\)"):  # fmt: skip
        ddpkit.init(join_timeout=2)
    assert time.monotonic() - start < 10


def test_unreachable_master_is_named(torchrun_env) -> None:
    port = free_port()  # nobody listens here
    torchrun_env(rank=1, world_size=2, master_addr="127.0.0.1", master_port=port)
    with pytest.raises(RendezvousError, match=f"could not reach the rendezvous store at "
                       f"127.0.0.1:{port} within 2 s"):  # fmt: skip
        ddpkit.init(join_timeout=2)


def test_inconsistent_explicit_ranks_show_the_arithmetic() -> None:
    with pytest.raises(ConfigError, match=r"rank 2 is outside 0\.\.1 \(world size 2"):
        ddpkit.init(init_method="tcp://127.0.0.1:29999", rank=2, world_size=2)


def test_automatic_backend_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    ddpkit.init()
    assert "backend gloo, device cpu (no CUDA GPU visible)" in capsys.readouterr().out


@pytest.mark.parametrize("scheme", ["tcp", "file"])
def test_tutorial_style_init_methods_form_a_group(scheme: str, tmp_path: Path) -> None:
    url = f"tcp://127.0.0.1:{free_port()}" if scheme == "tcp" else f"file://{tmp_path}/pg"
    results = ddpkit.spawn(mp_workers.init_with_url, 2, url)
    assert [r["sum_of_ranks"] for r in results] == [1.0, 1.0]
    if scheme == "tcp":  # the world records the address the URL named
        assert [r["master"] for r in results] == [url, url]


@pytest.mark.timeout(240)
def test_ten_reruns_each_seconds_after_kill_9_all_meet(tmp_path: Path) -> None:
    """The file a killed run leaves is seconds old; a new run must not read its keys."""
    url = f"file://{tmp_path / 'pg'}"
    for cycle in range(10):
        first = cycle % 2  # rank 1 arriving first must not trust the old file either
        ranks = [_start_rank(url, rank, hold=True) for rank in (first, 1 - first)]
        outputs = [_read_until_joined(rank) for rank in ranks]
        for rank in ranks:
            rank.kill()  # SIGKILL: no clean close, the file stays behind
            rank.wait()
        assert all("joined 2" in out for out in outputs), (cycle, outputs)
        assert (tmp_path / "pg").exists()  # what the next cycle has to deal with
    last = [_start_rank(url, rank, hold=False) for rank in (0, 1)]
    finished = [rank.communicate(timeout=60) for rank in last]
    assert [rank.returncode for rank in last] == [0, 0], finished
    assert "removed FileStore file" in finished[0][0] + finished[1][0]
    assert not (tmp_path / "pg").exists()  # a clean run's FileStore deletes its file


def _start_rank(url: str, rank: int, hold: bool) -> subprocess.Popen[str]:
    command = [sys.executable, str(SCRIPTS / "join_file_store.py"), url, str(rank), "2"]
    return subprocess.Popen([*command, *(["hold"] if hold else [])], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip


def _read_until_joined(rank: subprocess.Popen[str]) -> str:
    """Its output up to "joined" (a hang shows as this test's timeout, with what it said)."""
    assert rank.stdout is not None
    lines = []
    for line in rank.stdout:
        lines.append(line)
        if line.startswith("joined"):
            break
    return "".join(lines)


def test_a_stale_file_store_does_not_freeze_the_next_run(tmp_path: Path) -> None:
    store_file = tmp_path / "pg"
    store_file.write_bytes(b"\x08\x00\x00\x00refcount\x01\x00\x00\x003")  # a killed run's leftovers
    old = time.time() - 3600
    os.utime(store_file, (old, old))
    results = ddpkit.spawn(mp_workers.init_with_url, 2, f"file://{store_file}")
    assert [r["sum_of_ranks"] for r in results] == [1.0, 1.0]


def test_single_node_store_listens_on_loopback_only() -> None:
    addresses = ddpkit.spawn(mp_workers.store_listen_addresses, 1)[0]
    assert addresses == ["0100007F"]  # 127.0.0.1 in /proc's hex; no 0.0.0.0 or [::]


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_two_launchers_form_one_multi_node_job(mode: str) -> None:
    """Two `ddpkit run` agents (two "nodes") on this machine, static or c10d rendezvous."""
    port = free_port()
    script = SCRIPTS / "plain_allreduce.py"
    flags = {
        "static": lambda rank: ["--nnodes", "2", "--node-rank", str(rank),
                                "--master", f"127.0.0.1:{port}"],
        "dynamic": lambda rank: ["--nnodes", "1:2", "--rdzv-endpoint", f"127.0.0.1:{port}",
                                 "--rdzv-id", f"job-{port}"],
    }[mode]  # fmt: skip
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ddpkit",
                "run",
                "--nproc",
                "1",
                *flags(rank),
                "--local-addr",
                "127.0.0.1",
                str(script),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [node.communicate(timeout=90) for node in nodes]
    finally:
        for node in nodes:  # a hang must fail the test, not leave launchers behind
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], outputs
    printed = "".join(out for out, _ in outputs)
    assert "rank 0 of 2: sum of ranks = 1" in printed  # one job of 2, not two jobs of 1
    assert "rank 1 of 2: sum of ranks = 1" in printed


def test_spawn_checks_its_node_arguments() -> None:
    with pytest.raises(ConfigError, match=r"--node-rank 2 is outside 0\.\.1"):
        ddpkit.spawn(mp_workers.world_fields, 2, nnodes=2, node_rank=2, master="127.0.0.1:29500")
    with pytest.raises(ConfigError, match="needs to know where nodes meet"):
        ddpkit.spawn(mp_workers.world_fields, 2, nnodes=2, node_rank=1)
