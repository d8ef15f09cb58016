"""The launcher-worker protocol: what a worker writes is what the launcher reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpkit._core import atomicfile
from ddpkit._core.protocol import (
    PREEMPTED_EXIT_CODE,
    RecordKind,
    error_record,
    failure_recorded,
    write_error_file,
)
from ddpkit.errors import PreemptedError
from ddpkit.launch.failures import recorded
from ddpkit.launch.worker import record_finished
from ddpkit.runtime.errorfile import record_failure


def test_the_preemption_exit_code_is_defined_once() -> None:
    assert PreemptedError.exitcode == PREEMPTED_EXIT_CODE == 75


@pytest.mark.parametrize(
    ("headline", "details", "kind"),
    [
        ("stopped by SIGTERM at epoch 2", "stopped", RecordKind.PREEMPTED),
        ("hang: rank 0 waited 6 s in all_reduce", "the whole report", RecordKind.HANG),
        ("ValueError: x", "Traceback ...", RecordKind.ERROR),
    ],
)
def test_a_recorded_failure_reads_back_in_the_launcher_with_its_kind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, headline: str, details: str, kind: RecordKind
) -> None:
    error_file = tmp_path / "run" / "attempt_0" / "1" / "error.json"  # torch's layout
    error_file.parent.mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    record_failure(headline, details, kind)
    assert json.loads(error_file.read_text())["message"]["message"] == headline
    [found] = recorded(tmp_path)
    assert (found.text, found.headline, found.kind) == (details, headline, kind)


def test_a_state_record_gives_way_to_a_failure_but_never_replaces_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    error_file = tmp_path / "run" / "attempt_0" / "0" / "error.json"
    error_file.parent.mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    record_failure("training (epoch 1, step 0)", "training", RecordKind.TRAINING)
    assert not failure_recorded()  # a state, not a failure
    write_error_file(error_record("ValueError: x", "y"), keep_existing=True)  # the script's error
    assert recorded(tmp_path)[0].kind is RecordKind.ERROR
    record_failure("training (epoch 2, step 5)", "training", RecordKind.TRAINING)
    record_finished()
    assert recorded(tmp_path)[0].headline == "ValueError: x" and failure_recorded()


def test_a_worker_that_wrote_its_error_file_is_ending_in_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    assert not failure_recorded()  # its watchdog will say it finished
    record_failure("ValueError: x", "Traceback ...")
    assert failure_recorded()


class _StoppedMidWrite(BaseException):
    """What a worker's stop handler does halfway through a write: it never comes back."""


def test_a_worker_stopped_while_writing_never_leaves_an_empty_error_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's agent parses the file once the worker has exited; an empty one killed the
    agent with a JSONDecodeError (seen when SIGTERM landed between creating and filling it)."""
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))

    def stopped(*_: object) -> None:  # the temporary is created and written, not yet renamed
        raise _StoppedMidWrite

    with monkeypatch.context() as patched:
        patched.setattr(atomicfile.os, "replace", stopped)
        with pytest.raises(_StoppedMidWrite):
            write_error_file(error_record("ValueError: x", "details"))
    assert not error_file.exists()  # no file is a failure without details; empty kills the agent
    assert list(tmp_path.iterdir()) == []  # nor a temporary left beside it
    write_error_file(error_record("ValueError: y", "details"))  # the next writer, whole
    assert json.loads(error_file.read_text())["message"]["message"] == "ValueError: y"


def test_an_error_file_is_written_without_waiting_for_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No one reads a worker's record after a power cut; an fsync per training record cost
    milliseconds on a busy disk. (Checkpoints, which must survive one, still sync.)"""
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    synced: list[int] = []
    monkeypatch.setattr(atomicfile.os, "fsync", synced.append)
    write_error_file(error_record("ValueError: x", "details"))
    assert json.loads(error_file.read_text())["message"]["message"] == "ValueError: x"
    assert synced == []
    atomicfile.atomic_write(tmp_path / "checkpoint.pt", lambda out: out.write(b"weights"))
    assert len(synced) == 2  # the file, then its folder's entry


def test_a_record_that_the_script_finished_is_no_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At exit the session asks whether the rank is failing (a finished rank tells its peers
    in the store); the worker's 'finished' record must not make it say yes."""
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    record_finished()
    assert error_file.exists() and not failure_recorded()
    error_file.unlink()
    write_error_file(error_record("ValueError: x", "details"))
    assert failure_recorded()
