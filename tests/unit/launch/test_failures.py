"""Which worker the launcher blames, from torch's failure records (no processes)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ddpkit._core.protocol import HANG_EXIT_CODE, RecordKind, error_record
from ddpkit.errors import PreemptedError
from ddpkit.launch.failures import is_echo, root_cause
from ddpkit.launch.launcher import launch_outcome

ECHO = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:4242"


def write_error_file(
    log_dir: Path,
    local_rank: int,
    message: str,
    stamp: int = 100,
    call: str | None = None,
    kind: RecordKind = RecordKind.ERROR,
) -> Path:
    path = log_dir / "run_abc" / "attempt_0" / str(local_rank) / "error.json"
    path.parent.mkdir(parents=True)
    headline = message.splitlines()[-1]
    record = error_record(headline, message, timestamp=stamp, call=call, kind=kind)
    path.write_text(json.dumps(record))
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
    assert blamed.detail.endswith("\nrank 0: failed when a peer left")


def test_the_ranks_the_same_thing_happened_to_are_one_line(tmp_path: Path) -> None:
    write_error_file(tmp_path, 1, "ValueError: bad batch on rank 1")
    for rank in (0, *range(2, 40)):
        write_error_file(tmp_path, rank, ECHO)
    err = ChildFailedError("train", {r: failure(r, 1) for r in range(40)})
    blamed = root_cause(err, tmp_path)
    assert blamed.rank == 1
    assert blamed.detail.endswith("\nranks 0,2,3,4,5,6,7,8 and 31 more: failed when a peer left")


def test_a_rank_stopped_while_failing_with_the_same_error_is_not_the_cause(tmp_path: Path
                                                                            ) -> None:  # fmt: skip
    # both ranks raised the same ConfigError; rank 0 was still exiting when the agent's
    # SIGTERM came (exit 75, its own error kept as its record): the job ends 1, not 75
    error = "ddpkit.errors.ConfigError: the dataset has 1 sample(s) but the job has 2 ranks"
    for rank in (0, 1):
        write_error_file(tmp_path, rank, error)
    err = ChildFailedError("train", {0: failure(0, 75), 1: failure(1, 1)})
    blamed = root_cause(err, tmp_path)
    assert (blamed.rank, blamed.exitcode) == (1, 1)
    assert "ranks 0,1 failed with the same error (exit code 1)" in str(blamed)


def test_the_failing_rank_stopped_while_exiting_still_ends_the_job_with_its_own_code(
    tmp_path: Path,
) -> None:
    # fc28: rank 1 raised; rank 0, in a barrier, failed when it left; the agent's SIGTERM
    # then reached rank 1 while it was still exiting (ddpkit's handler: exit 75). The cause
    # is rank 1 with exit code 1; a job ending 75 would ask a scheduler to requeue it.
    write_error_file(tmp_path, 1, "RuntimeError: deliberate failure on rank 1")
    write_error_file(tmp_path, 0, ECHO)  # gloo: the peer closed its connection
    err = ChildFailedError("train", {0: failure(0, 1), 1: failure(1, 75)})
    blamed = root_cause(err, tmp_path)
    assert (blamed.rank, blamed.exitcode) == (1, 1)
    assert "worker rank 1 failed (exit code 1)" in str(blamed)


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
    assert blamed.detail.endswith("\nrank 0: stopped by the launcher after rank 1 failed")


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


IMPORT_ERROR = (
    'Traceback (most recent call last):\n  File "train.py", line 2, in <module>\n'
    "    import tokenizers_typo\nModuleNotFoundError: No module named 'tokenizers_typo'"
)


def test_the_same_error_on_every_rank_is_shown_once(tmp_path: Path) -> None:
    write_error_file(tmp_path, 0, IMPORT_ERROR)
    write_error_file(tmp_path, 1, IMPORT_ERROR)
    blamed = root_cause(ChildFailedError("train", {0: failure(0, 1)}), tmp_path, local_world=2)
    assert str(blamed).startswith("ranks 0,1 failed with the same error (exit code 1):\n")
    assert blamed.detail == IMPORT_ERROR  # once, and no line for rank 1


def test_a_rank_that_waited_for_a_finished_rank_names_the_call_and_the_mistake(
    tmp_path: Path,
) -> None:
    write_error_file(tmp_path, 0, ECHO, call="all_reduce (train.py:41)")
    # rank 1 exited 0 before rank 0 failed: torch lists only rank 0
    blamed = root_cause(ChildFailedError("train", {0: failure(0, 1)}), tmp_path, local_world=2)
    first = str(blamed).splitlines()[0]
    assert first.startswith(
        "rank 0 waited in all_reduce (train.py:41) but rank 1 finished the script without "
        "calling it: every rank must make the same collective calls in the same order "
        "(evaluating or saving on rank 0 only?"
    )
    assert blamed.rank == 0 and ECHO in blamed.detail


def test_without_the_world_size_no_rank_is_said_to_have_finished(tmp_path: Path) -> None:
    write_error_file(tmp_path, 0, ECHO, call="all_reduce (train.py:41)")
    blamed = root_cause(ChildFailedError("train", {0: failure(0, 1)}), tmp_path)
    assert str(blamed).startswith("worker rank 0 failed (exit code 1):")


def test_a_worker_that_exited_75_on_the_agents_sigterm_is_not_the_cause(tmp_path: Path) -> None:
    write_error_file(tmp_path, 0, "stopped by SIGTERM outside training", 100, None,
                     RecordKind.PREEMPTED)  # fmt: skip
    write_error_file(tmp_path, 1, "ValueError: bad batch on rank 1", stamp=100)
    err = ChildFailedError("train", {0: failure(0, 75), 1: failure(1, 1)})
    blamed = root_cause(err, tmp_path, local_world=2)
    assert (blamed.rank, blamed.exitcode) == (1, 1)
    assert blamed.detail.endswith("\nrank 0: stopped by the launcher after rank 1 failed")


def test_a_sys_exit_code_is_kept_when_torch_did_not_see_the_worker_exit(tmp_path: Path) -> None:
    path = tmp_path / "run_abc" / "attempt_0" / "1" / "error.json"
    path.parent.mkdir(parents=True)
    said = "the script called sys.exit(3) at train.py:48"
    path.write_text(json.dumps(error_record(said, said, exitcode=3)))
    write_error_file(tmp_path, 0, ECHO)
    # torch listed only rank 0: rank 1 was still in its atexit handlers at the agent's poll
    blamed = root_cause(ChildFailedError("train", {0: failure(0, 1)}), tmp_path, local_world=2)
    assert (blamed.rank, blamed.exitcode) == (1, 3) and said in blamed.detail


FINISHED = "finished the script"


def test_a_rank_stopped_while_exiting_after_it_finished_is_not_blamed(tmp_path: Path) -> None:
    """Under load the finished rank is still tearing down when its peer fails: the agent's
    SIGTERM reaches it there. It was blamed ('killed by signal 15') 1 run in 2 under load."""
    write_error_file(tmp_path, 0, ECHO, call="all_reduce_sum (train.py:55)")
    file1 = write_error_file(tmp_path, 1, FINISHED, kind=RecordKind.FINISHED)
    err = ChildFailedError("train", {0: failure(0, 1), 1: failure(1, -15, str(file1))})
    blamed = root_cause(err, tmp_path, local_world=2)
    assert (blamed.rank, blamed.exitcode) == (0, 1)
    assert str(blamed).startswith(
        "rank 0 waited in all_reduce_sum (train.py:55) but rank 1 finished the script without "
        "calling it"
    )
    assert blamed.detail.endswith(
        "\nrank 1: finished the script (killed by signal 15 while exiting)"
    )


def test_a_finished_ranks_record_is_no_failure_when_it_exited_0(tmp_path: Path) -> None:
    write_error_file(tmp_path, 0, "ValueError: bad batch on rank 0")
    write_error_file(tmp_path, 1, FINISHED, kind=RecordKind.FINISHED)  # torch lists rank 0 only
    blamed = root_cause(ChildFailedError("train", {0: failure(0, 1)}), tmp_path, local_world=2)
    assert (blamed.rank, blamed.exitcode) == (0, 1)
    assert blamed.detail == "ValueError: bad batch on rank 0"


def test_a_teardown_crash_after_the_script_finished_says_so(tmp_path: Path) -> None:
    file1 = write_error_file(tmp_path, 1, FINISHED, kind=RecordKind.FINISHED)
    err = ChildFailedError("train", {1: failure(1, -6, str(file1))})
    blamed = root_cause(err, tmp_path, local_world=2)
    assert (blamed.rank, blamed.exitcode) == (1, -6)
    assert str(blamed).startswith("rank 1 finished the script, then failed while exiting")


def test_a_killed_worker_whose_file_says_it_was_training_is_reported_by_its_signal(
    tmp_path: Path,
) -> None:
    file1 = write_error_file(tmp_path, 1, "training (epoch 2, step 9)", kind=RecordKind.TRAINING)
    blamed = root_cause(ChildFailedError("train", {1: failure(1, -9, str(file1))}), tmp_path)
    assert (blamed.rank, blamed.exitcode) == (1, -9)
    assert "SIGKILL" in blamed.detail and "training" not in blamed.detail


def test_every_rank_preempted_is_a_preemption_not_a_failure(tmp_path: Path) -> None:
    said = "stopped by SIGTERM at epoch 2, step 9 after saving runs/x/e.pt; run the same command"
    for rank in (0, 1):
        write_error_file(tmp_path, rank, said, kind=RecordKind.PREEMPTED)
    err = ChildFailedError("train", {0: failure(0, 75), 1: failure(1, 75)})
    outcome = launch_outcome(err, str(tmp_path), local_world=2)
    assert isinstance(outcome, PreemptedError) and str(outcome) == said


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        ([], "stopped by SIGTERM while starting; run it again"),
        ([RecordKind.TRAINING], "stopped by SIGTERM during training (training (epoch 2, step 9)) "
                                "before they reached a step where they could checkpoint"),
        ([RecordKind.TRAINING, RecordKind.PREEMPTED], "saved"),
    ],
)  # fmt: skip
def test_a_stop_signal_to_the_launcher_says_how_far_the_workers_got(
    tmp_path: Path, kinds: list[RecordKind], expected: str
) -> None:
    texts = {RecordKind.TRAINING: "training (epoch 2, step 9)", RecordKind.PREEMPTED: "saved"}
    for rank, kind in enumerate(kinds):
        write_error_file(tmp_path, rank, texts[kind], kind=kind)
    outcome = launch_outcome(SignalException("", signal.SIGTERM), str(tmp_path))
    assert isinstance(outcome, PreemptedError) and str(outcome).startswith(expected)


def test_a_node_whose_workers_only_echo_a_lost_peer_exits_retriable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_error_file(tmp_path, 0, ECHO)  # its peers on the other node went away
    lost = root_cause(ChildFailedError("train", {0: failure(0, 1)}), tmp_path)
    assert lost.peer_lost
    write_error_file(tmp_path / "own", 0, "ValueError: bad batch")
    assert not root_cause(ChildFailedError("train", {0: failure(0, 1)}), tmp_path / "own").peer_lost
    # the launcher's exit code, which a Kubernetes podFailurePolicy reads
    from ddpkit import cli
    from ddpkit.errors import RendezvousError

    for raised, code in ((lost, 69), (RendezvousError("master-0 not resolvable"), 69)):

        def fail(_args: object, err: Exception = raised) -> int:
            raise err

        monkeypatch.setattr("ddpkit.launch.command.main", fail)
        assert cli.main(["run", "--nproc", "1", "examples/wine.py"]) == code


def test_a_reported_hang_ends_the_job_with_the_hang_code_whatever_the_rank_exited(
    tmp_path: Path,
) -> None:
    # The reporter's script failed when its peer left after the report (exit 1): the job
    # still says hang (124), the code restart policies act on.
    file0 = write_error_file(tmp_path, 0, "hang: rank 0 waited 5 s in the metric",
                             kind=RecordKind.HANG)  # fmt: skip
    err = ChildFailedError("train", {0: failure(0, 1, str(file0)), 1: failure(1, 124)})
    blamed = root_cause(err, tmp_path)
    assert (blamed.rank, blamed.exitcode) == (0, HANG_EXIT_CODE)
