"""``ddpkit run --hosts`` refuses a host that ssh could read as one of its options (the class
of CVE-2017-1000117 and CVE-2023-51385: ``-oProxyCommand=...`` runs a command on this
machine) before any ssh runs: exit 2, the bad host named. An ``ssh`` first on the PATH
records any call, so a refusal that came after ssh started would show."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launch_helpers import REPO

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(60)]


@pytest.fixture
def watched_ssh(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose ``ssh`` writes down each call, and the file it writes to."""
    calls = tmp_path / "ssh-calls"
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit 255\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}, calls


def ddpkit_run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ddpkit", "run", *argv, "examples/wine.py"]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=50)


@pytest.mark.parametrize("given", ["--hosts=-oProxyCommand={x}", "--hosts=a,-oProxyCommand={x}",
                                   "--hosts=me@-oProxyCommand={x}"])  # fmt: skip
def test_a_host_that_would_be_an_ssh_option_is_refused_before_ssh_runs(
    given: str, watched_ssh: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    env, calls = watched_ssh
    proxy = tmp_path / "x.sh"
    done = ddpkit_run(env, given.format(x=proxy))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"-oProxyCommand={proxy}' is not a host" in done.stderr, done.stderr
    assert not calls.exists(), calls.read_text()


def test_a_hostfile_line_that_would_be_an_ssh_option_is_refused_before_ssh_runs(
    watched_ssh: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    env, calls = watched_ssh
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"node1 slots=2\n-oProxyCommand={tmp_path / 'x.sh'} slots=2\n")
    done = ddpkit_run(env, "--hostfile", str(hostfile))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--hostfile {hostfile} line 2: '-oProxyCommand=" in done.stderr, done.stderr
    assert not calls.exists(), calls.read_text()


def test_a_good_host_reaches_ssh_after_the_double_dash(
    watched_ssh: tuple[dict[str, str], Path],
) -> None:
    """The control: the same command with good hosts does call ssh, host after ``--``."""
    env, calls = watched_ssh
    done = ddpkit_run(env, "--hosts", "node1,me@node2")
    assert done.returncode == 2 and "ssh cannot log in" in done.stderr, done.stderr
    lines = sorted(calls.read_text().splitlines())
    assert [line.split(" -- ", 1)[1].split()[0] for line in lines] == ["me@node2", "node1"]
    assert all(line.endswith("-m ddpkit.launch.remote.entry") for line in lines), lines
