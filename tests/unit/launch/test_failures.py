"""Which worker the launcher blames, from torch's failure records (no processes)."""

from __future__ import annotations

import json
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ddpkit.launch.failures import is_echo, root_cause

ECHO = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:4242"


def write_error_file(log_dir: Path, local_rank: int, message: str, stamp: int = 100) -> Path:
    path = log_dir / "run_abc" / "attempt_0" / str(local_rank) / "error.json"
    path.parent.mkdir(parents=True)
    payload = {"message": message, "extraInfo": {"py_callstack": message, "timestamp": str(stamp)}}
    path.write_text(json.dumps({"message": payload}))
    return path


def failure(local_rank: int, exitcode: int, error_file: str = "<N/A>") -> ProcessFailure:
    return ProcessFailure(local_rank=local_rank, pid=100 + local_rank, exitcode=exitcode,
                          error_file=error_file)  # fmt: skip


def test_echo_detection() -> None:
    assert is_echo(ECHO)
    assert not is_echo("ValueError: shapes (3,) and (4,) do not match")


def test_the_rank_with_a_cause_is_blamed_over_the_echo(tmp_path: Path) -> None:
    write_error_file(tmp_path, 0, ECHO)
    write_error_file(tmp_path, 1, "ValueError: bad batch on rank 1")
    # torch reported only rank 0 (as it does for function workers), same second for both
    err = ChildFailedError("train", {0: failure(0, 1)})
    blamed = root_cause(err, tmp_path)
    assert blamed.rank == 1 and blamed.exitcode == 1
    assert "ValueError: bad batch on rank 1" in blamed.detail
    assert "also failed: rank 0 after its peer died" in blamed.detail


def test_an_exception_outranks_the_agents_sigterm(tmp_path: Path) -> None:
    file1 = write_error_file(tmp_path, 1, "KeyError: 'label'")
    err = ChildFailedError("train", {0: failure(0, 1), 1: failure(1, -15, str(file1))})
    blamed = root_cause(err, tmp_path)
    assert (blamed.rank, blamed.exitcode) == (1, 1)


def test_a_killed_worker_without_error_file_is_reported_by_signal(tmp_path: Path) -> None:
    blamed = root_cause(ChildFailedError("train", {1: failure(1, -9)}), tmp_path)
    assert blamed.rank == 1 and blamed.exitcode == -9
    assert "SIGKILL" in blamed.detail and "killed by signal 9" in str(blamed)


def test_a_sigkilled_worker_outranks_the_peer_the_agent_then_sigtermed(tmp_path: Path) -> None:
    # torch's own records: both describe a signal, both carry the same whole-second timestamp
    err = ChildFailedError("train", {0: failure(0, -15), 1: failure(1, -9)})
    blamed = root_cause(err, tmp_path)
    assert (blamed.rank, blamed.exitcode) == (1, -9)
    assert "also failed: rank 0" in blamed.detail


def test_a_lone_sigterm_death_is_still_blamed(tmp_path: Path) -> None:
    blamed = root_cause(ChildFailedError("train", {1: failure(1, -15)}), tmp_path)
    assert (blamed.rank, blamed.exitcode) == (1, -15)


def test_newest_restart_attempt_wins(tmp_path: Path) -> None:
    old = tmp_path / "run_abc" / "attempt_0" / "0" / "error.json"
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps({"message": {"message": "OldError", "extraInfo": {
        "py_callstack": "OldError", "timestamp": "1"}}}))  # fmt: skip
    new = tmp_path / "run_abc" / "attempt_1" / "0" / "error.json"
    new.parent.mkdir(parents=True)
    new.write_text(old.read_text().replace("OldError", "NewError"))
    blamed = root_cause(ChildFailedError("train", {0: failure(0, 1)}), tmp_path)
    assert "NewError" in blamed.detail and "OldError" not in blamed.detail
