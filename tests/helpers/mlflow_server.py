"""A real MLflow tracking server for the tracker tests: ``mlflow server`` with a SQLite
store, on a free loopback port, in a process group of its own (it runs a web server and
workers); stopping it (the context's end) leaves nothing running."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def mlflow_server(folder: Path, timeout: float = 90) -> Iterator[str]:
    """Start the server with its database and artifacts in ``folder``; its URL."""
    port = _free_port()
    command = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
        "--default-artifact-root", str(folder / "artifacts"),
    ]  # fmt: skip
    # No job runner: it keeps its queues in a folder of /dev/shm that the server leaves there
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with (folder / "server.log").open("w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)  # fmt: skip
        try:
            yield _ready(f"http://127.0.0.1:{port}", server, folder / "server.log", timeout)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


def server_processes(folder: Path) -> list[str]:
    """Processes still serving ``folder``'s database (none after the context)."""
    found = subprocess.run(["pgrep", "-af", str(folder)], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


def _ready(url: str, server: subprocess.Popen[bytes], log: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return url
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the MLflow server did not start: {log.read_text()[-3000:]}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
