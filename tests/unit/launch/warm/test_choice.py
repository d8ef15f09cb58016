"""Warm workers are ``ddpkit run``'s default; a fresh python per worker where it is asked for
(``--fresh-workers``, torchrun's own ``--start-method spawn|fork``) or needed (``--no-python``)."""

from __future__ import annotations

import argparse

import pytest

from ddpkit.errors import ConfigError
from ddpkit.launch.command import add_arguments, launch_plan
from ddpkit.launch.warm.choice import choose_workers, warm


def parsed(*argv: str, monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    monkeypatch.delenv("PET_START_METHOD", raising=False)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([*argv, "train.py"])
    choose_workers(args)
    return args


@pytest.mark.parametrize(("argv", "expected"), [
    ((), ("forkserver", True)),  # the default: forks of the warm server
    (("--run-path",), ("forkserver", True)),
    (("--start-method", "forkserver"), ("forkserver", True)),
    (("--fresh-workers",), ("spawn", False)),  # a python per worker, torchrun's default
    (("--fresh-workers", "--run-path"), ("spawn", True)),  # spawned from a function
    (("--start-method", "spawn"), ("spawn", False)),  # torchrun's meaning, whole
    (("--start-method", "fork", "--run-path"), ("fork", True)),
])  # fmt: skip
def test_how_the_workers_start(argv, expected, monkeypatch) -> None:
    args = parsed(*argv, monkeypatch=monkeypatch)
    assert (args.start_method, args.run_path) == expected
    assert warm(args) == (expected == ("forkserver", True))
    assert launch_plan(args, environ={}).start_method == expected[0]


def test_an_executable_is_never_forked_from_the_server(monkeypatch) -> None:
    args = parsed("--no-python", monkeypatch=monkeypatch)
    assert not warm(args) and not args.run_path


def test_torchruns_environment_default_keeps_its_meaning(monkeypatch) -> None:
    monkeypatch.setenv("PET_START_METHOD", "spawn")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["train.py"])
    choose_workers(args)
    assert (args.start_method, args.run_path) == ("spawn", False)


def test_fresh_workers_and_the_warm_start_method_are_refused_together(monkeypatch) -> None:
    with pytest.raises(ConfigError, match=r"--fresh-workers .* --start-method forkserver"):
        parsed("--fresh-workers", "--start-method", "forkserver", monkeypatch=monkeypatch)
