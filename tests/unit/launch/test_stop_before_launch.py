"""A stop signal while `ddpkit run` imports torch ends it with 75, whatever the imported code
does: the stop used to be an Exception raised inside the import, which torch's optional
imports (`except Exception: pass`) swallowed (the job then trained on), and which aborted the
process when it surfaced in a C++ frame (`terminate called ... pybind11::error_already_set`),
both seen in make test. Now the signal is only noted there, and the run stops after it."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from ddpkit import cli


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The commands `main` went on to run; the stop handlers put back afterwards."""
    started: list[str] = []
    monkeypatch.setattr(cli, "_run", lambda args, module: started.append(args.command) or 0)
    monkeypatch.setattr(cli, "command_module", lambda name: None)
    monkeypatch.setattr(cli, "_stops_before_launch", [], raising=False)
    before = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGUSR1)}
    yield started
    for number, handler in before.items():
        signal.signal(number, handler)


@pytest.mark.parametrize("caught", [Exception, BaseException])
def test_a_stop_signal_during_start_up_is_never_swallowed(
    launches: list[str], monkeypatch: pytest.MonkeyPatch, caught: type[BaseException]
) -> None:
    def importing_torch(argv: list[str]) -> Any:
        with contextlib.suppress(caught):  # an import that would catch what a handler raised
            os.kill(os.getpid(), signal.SIGTERM)  # the signal lands inside it
        return argparse.Namespace(command="run")

    monkeypatch.setattr(cli, "parse", importing_torch)
    assert cli.main(["run", "train.py"]) == 75
    assert launches == []  # no worker was started
