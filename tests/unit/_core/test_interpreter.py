"""ddpkit's own processes skip two costs of Python's: the cyclic collector while torch is
imported, and the interpreter's teardown at the end (ddpkit._core.interpreter). Endings run
in fresh interpreters: a teardown skipped or not is only seen from outside."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from ddpkit import cli
from ddpkit._core.interpreter import collector_paused

ENDING = """
import atexit, sys, threading, time
from ddpkit._compat.python import exit_without_teardown

class Loud:
    def __del__(self):
        sys.stderr.write("torn down\\n")

kept = Loud()  # freed only by the interpreter's teardown
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread finished"))).start()
print("unflushed", end="")
{ending}
"""


def end_with(ending: str) -> subprocess.CompletedProcess[str]:
    script = ENDING.format(ending=ending)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def test_ending_without_teardown_still_ends_as_python_does_first() -> None:
    done = end_with("exit_without_teardown(3)")
    assert done.returncode == 3
    # the thread was waited for, the handlers ran, the output was flushed
    assert done.stdout == "unflushedthread finished\natexit ran\n"
    assert "torn down" not in done.stderr  # the teardown, and only it, was skipped


def test_the_teardown_it_skips_is_there_in_a_plain_ending() -> None:
    done = end_with("sys.exit(3)")
    assert done.returncode == 3 and "torn down" in done.stderr  # what the test above tells


def test_the_collector_is_back_as_it_was_even_after_an_error() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError
    assert gc.isenabled()


class _Parsed(Exception):
    pass


def test_the_command_line_is_read_with_the_collector_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = []

    def parse(argv: list[str]) -> None:
        seen.append(gc.isenabled())  # `ddpkit run` imports torch here
        raise _Parsed

    monkeypatch.setattr(cli, "parse", parse)
    with pytest.raises(_Parsed):
        cli.main(["doctor"])
    assert seen == [False] and gc.isenabled()


def test_the_command_ends_with_its_commands_exit_code() -> None:
    done = subprocess.run([sys.executable, "-m", "ddpkit", "slurm", "--nodes", "0", "x.py"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--nodes" in done.stderr  # the one line saying what was wrong, flushed
