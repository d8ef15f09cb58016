"""A worker's error file: what the uncaught-exception hook writes, and what it leaves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ddpkit._core.protocol import ERROR_FILE_ENV, RecordKind, error_kind
from ddpkit.runtime.errorfile import install_error_file_hook, record_failure

ECHO = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:4242")


def recorded(path: Path) -> tuple[RecordKind, str]:
    message = json.loads(path.read_text())["message"]
    return error_kind(message), message["message"]


def uncaught(exc: BaseException, monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """What Python does with an exception nothing caught, through ddpkit's hook."""
    monkeypatch.setenv(ERROR_FILE_ENV, str(path))
    monkeypatch.setattr(sys, "excepthook", lambda *_: None)  # the previous hook: quiet
    install_error_file_hook()
    sys.excepthook(type(exc), exc, None)


def test_an_uncaught_exception_is_recorded(monkeypatch, tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    uncaught(ValueError("bad batch"), monkeypatch, path)
    assert recorded(path) == (RecordKind.ERROR, "ValueError: bad batch")


def test_an_exception_after_a_hang_report_leaves_the_report(monkeypatch, tmp_path) -> None:
    # The report was written, then the peer left and this rank's collective failed: the
    # report is the cause the launcher must read, the exception only its echo.
    path = tmp_path / "error.json"
    monkeypatch.setenv(ERROR_FILE_ENV, str(path))
    record_failure("hang: rank 0 waited 5 s in the metric", "...", RecordKind.HANG)
    uncaught(ECHO, monkeypatch, path)
    assert recorded(path) == (RecordKind.HANG, "hang: rank 0 waited 5 s in the metric")


def test_an_exception_replaces_a_state_record(monkeypatch, tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    monkeypatch.setenv(ERROR_FILE_ENV, str(path))
    record_failure("training (step 3)", "training (step 3)", RecordKind.TRAINING)
    uncaught(ValueError("bad batch"), monkeypatch, path)
    assert recorded(path)[0] is RecordKind.ERROR
