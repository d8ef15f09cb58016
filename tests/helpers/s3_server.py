"""A real S3-compatible server for the object-storage tests: moto's, in a process of its own.

It speaks S3 over HTTP on a loopback port; s3fs (and so ddpkit) reaches it through the
standard ``AWS_ENDPOINT_URL`` and credentials variables, in this process and in every worker
the tests launch. Stopping it (the context's end) leaves nothing running.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SETTINGS = {
    "AWS_ACCESS_KEY_ID": "ddpkit-test",
    "AWS_SECRET_ACCESS_KEY": "ddpkit-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextmanager
def s3_server(timeout: float = 60) -> Iterator[str]:
    """Start the server on a free loopback port; its endpoint URL, until the block ends.

    Its output (a line per request) goes to a file: a pipe nobody reads would fill and
    stop the server mid-test."""
    with tempfile.NamedTemporaryFile("w+", prefix="moto-", suffix=".log") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            yield _endpoint(server, Path(log.name), timeout)
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _endpoint(server: subprocess.Popen[bytes], log: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        found = re.search(r"Running on (http://127\.0\.0\.1:\d+)", log.read_text())
        if found:
            return found.group(1)
        time.sleep(0.05)
    raise RuntimeError(f"the S3 server did not start: {log.read_text()}")


@contextmanager
def s3_environment(endpoint: str) -> Iterator[None]:
    """Point s3fs at ``endpoint``, here and in the processes started meanwhile."""
    saved = {key: os.environ.get(key) for key in (*SETTINGS, "AWS_ENDPOINT_URL")}
    os.environ.update({**SETTINGS, "AWS_ENDPOINT_URL": endpoint})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
