"""The ddpkit logger: rank 0's notices on stdout, warnings on stderr, silenced by level."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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


@pytest.mark.parametrize("where", ["before_import", "after_import", "after_init"])
def test_users_redirect_the_messages_to_a_file_instead_of_the_screen(
    tmp_path: Path, where: str
) -> None:
    """As the README shows it, at any point of the script: ``import ddpkit`` is lazy, so the
    logger is set up at ``init()``; a handler the user gave before then must not get ours
    beside it (it did: the notices went to the file and to the screen)."""
    to_file = 'logging.getLogger("ddpkit").handlers = [logging.FileHandler("ddpkit.log")]'
    lines = ["import logging", "import ddpkit", "ddpkit.init()", "ddpkit.shutdown()"]
    lines.insert({"before_import": 1, "after_import": 2, "after_init": 3}[where], to_file)
    script = "\n".join(lines) + '\nimport ddpkit._core.log as log\nlog.logger.info("saved x")\n'
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    on_screen, in_file = done.stdout + done.stderr, (tmp_path / "ddpkit.log").read_text()
    assert "saved x" in in_file and "saved x" not in on_screen
    if where != "after_init":  # init's start line too
        assert "world size 1" in in_file and "ddpkit:" not in on_screen


def test_a_users_handler_gets_rank_zeros_notices_only(tmp_path: Path) -> None:
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    log.logger.addHandler(handler)
    try:
        log.set_rank(1)
        log.logger.info("world size 2")
        log.logger.warning("rank 1: skipping a damaged file", extra=log.EVERY_RANK)
    finally:
        log.logger.removeHandler(handler)
    assert records == ["rank 1: skipping a damaged file"]
