"""The ddpkit logger: rank 0's notices on stdout, warnings on stderr, silenced by level."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from ddpkit._core import log


@pytest.fixture(autouse=True)
def _rank_and_level_restored() -> Iterator[None]:
    level = log.logger.level
    yield
    log.set_rank(None)
    log.logger.setLevel(level)


def test_notices_go_to_stdout_and_warnings_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    log.logger.info("saved runs/x/epoch_000001.pt")
    log.logger.warning("warning: rank 1: skipping a damaged file", extra=log.EVERY_RANK)
    out, err = capsys.readouterr()
    assert out == "ddpkit: saved runs/x/epoch_000001.pt\n"
    assert err == "ddpkit: warning: rank 1: skipping a damaged file\n"


def test_only_rank_zero_gives_notices_unless_marked_every_rank(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log.set_rank(1)
    log.logger.info("world size 2")
    log.logger.error("rank 1: hang reported by rank 0", extra=log.EVERY_RANK)
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "ddpkit: rank 1: hang reported by rank 0\n"


def test_rank_comes_from_the_environment_before_init(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    assert log.current_rank() == 3
    log.set_rank(0)
    assert log.current_rank() == 0


def test_a_command_speaks_in_its_own_name_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    log.command_logger("run").info("2 worker(s) on this node")
    out, err = capsys.readouterr()
    assert (out, err) == ("", "ddpkit run: 2 worker(s) on this node\n")


def test_users_silence_notices_with_the_standard_library(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logging.getLogger("ddpkit").setLevel(logging.WARNING)
    log.logger.info("resumed from runs/x/epoch_000002.pt")
    log.command_logger("run").info("2 worker(s) on this node")
    assert capsys.readouterr() == ("", "")
