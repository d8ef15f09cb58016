"""Hosts that accept ssh, for ``ddpkit run --hosts``: Debian's OpenSSH server in each of the
tests' network namespaces (:mod:`helpers.netns`), root logging in by a key made here.

Everything is the test's own: a client key and a host key in its folder, an sshd config per
host listening on the host's address only, and an ssh config file naming each host (with
its address) that the tests hand to ``ddpkit run --ssh-config``. openssh-server is installed
with apt-get the first time, as SLURM is; the servers are stopped at the block's end.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from helpers.launch_helpers import ensure_debian_packages
from helpers.netns import VirtualHost

SSHD = "/usr/sbin/sshd"


@contextlib.contextmanager
def ssh_servers(hosts: list[VirtualHost], folder: Path) -> Iterator[Path]:
    """An sshd on each of ``hosts``; the ssh config file that reaches them by name."""
    ensure_debian_packages({"sshd": "openssh-server", "ssh-keygen": "openssh-client"})
    folder.mkdir(parents=True, exist_ok=True)
    client, host_key = folder / "client", folder / "host_ed25519"
    for key in (client, host_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                       check=True, capture_output=True)  # fmt: skip
    (folder / "authorized_keys").write_text(client.with_suffix(".pub").read_text())
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
    servers = [_start(host, folder, host_key) for host in hosts]
    try:
        for host in hosts:
            _wait_for_port(host.address, 22)
        yield _client_config(hosts, folder, client)
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=10)


def _start(host: VirtualHost, folder: Path, host_key: Path) -> subprocess.Popen[bytes]:
    config = folder / f"sshd_{host.name}"
    config.write_text(
        f"ListenAddress {host.address}\nPort 22\nHostKey {host_key}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "StrictModes no\nPidFile none\nPrintMotd no\nLogLevel ERROR\n"
    )
    log = (folder / f"sshd_{host.name}.log").open("wb")
    return subprocess.Popen(host.command(SSHD, "-D", "-e", "-f", str(config)),
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip


def _client_config(hosts: list[VirtualHost], folder: Path, key: Path) -> Path:
    config = folder / "ssh_config"
    entries = [f"Host {host.name}\n  HostName {host.address}\n" for host in hosts]
    config.write_text(
        "".join(entries) + f"Host *\n  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
        "  UserKnownHostsFile /dev/null\n  StrictHostKeyChecking no\n  LogLevel ERROR\n"
    )
    return config


def _wait_for_port(address: str, port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((address, port), 1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"sshd on {address}:{port} did not start within {timeout} s")
