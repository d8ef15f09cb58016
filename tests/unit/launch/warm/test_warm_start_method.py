"""Warm workers fall back to spawn, said once with the fix, where the server's socket cannot
be made: a ``TMPDIR`` so long that the socket's path passes AF_UNIX's 107 bytes, which
Python 3.11's forkserver meets with a traceback ("AF_UNIX path too long"). Each case runs in
a fresh interpreter: multiprocessing keeps its temporary folder for the process's life."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import logging
from ddpkit.launch.warm.forkserver import warm_start_method
logging.basicConfig(format="%(message)s")
print(warm_start_method(), warm_start_method())
"""


def method_under(tmpdir: Path) -> tuple[str, str]:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(tmpdir)}, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr


def test_a_temporary_folder_too_long_for_the_servers_socket_gives_spawn(tmp_path: Path) -> None:
    long = tmp_path / ("x" * (100 - len(str(tmp_path))))
    long.mkdir()
    method, said = method_under(long)
    assert method == "spawn spawn"
    assert said.count("set TMPDIR to a shorter folder") == 1, said  # once, however often asked


def test_a_short_one_keeps_the_server(tmp_path: Path) -> None:
    method, said = method_under(tmp_path)
    assert method == "forkserver forkserver" and said == ""
