"""The hang watchdog's decisions and reports, with an in-memory store and no processes."""

from __future__ import annotations

import faulthandler
import json
import os
import time
from collections.abc import Iterator

import pytest
import torch
from torch.distributed import HashStore, PrefixStore

import ddpkit
import ddpkit.runtime.watchdog
from ddpkit._core.protocol import HANG_EXIT_CODE
from ddpkit._core.tracebacks import is_hidden, thread_stack
from ddpkit.errors import ConfigError
from ddpkit.runtime.hangreport import compose_report, missing_ranks
from ddpkit.runtime.position import (
    LOADING,
    OPTIMIZER_STEP,
    STAGES_PER_BATCH,
    backward_stage,
)
from ddpkit.runtime.watchdog import (
    Watchdog,
    current_watchdog,
    resolve_hang_timeout,
    start_watchdog,
    watch,
)


@pytest.fixture(autouse=True)
def _no_backstop_left_armed() -> Iterator[None]:
    """check_once arms faulthandler's process-wide timer while an activity runs; a test's
    dog is never stopped, and the timer would end pytest itself in a later test."""
    yield
    faulthandler.cancel_dump_traceback_later()


def make_dog(store, rank: int = 0, world_size: int = 2, timeout: float = 0.05) -> Watchdog:
    dog = Watchdog(timeout_s=timeout, rank=rank, world_size=world_size, store=store)
    dog.grace_s = 0.3  # the tests' peers answer at once, or never
    dog.exits = []  # type: ignore[attr-defined]
    dog.exit = dog.exits.append  # type: ignore[attr-defined]  # record instead of os._exit
    return dog


def peer_state(doing: str | None, progress: int) -> str:
    stack = ['File "train.py", line 9, in main']
    return json.dumps({"doing": doing, "for_s": 1.0, "last": "barrier()", "progress": progress,
                       "host": "peer", "pid": 7, "stack": stack})  # fmt: skip


def test_an_activity_past_the_timeout_reports_the_missing_rank_and_exits(capfd) -> None:
    store = PrefixStore("hang/", HashStore())
    store.set("state/1", peer_state(None, progress=0))  # rank 1 stopped before the call
    dog = make_dog(store)
    dog.begin("all_reduce_sum(float64[])")
    time.sleep(0.1)
    dog.check_once()
    assert dog.exits == [HANG_EXIT_CODE]
    assert bytes(store.get("alarm")) == b"1" and bytes(store.get("reported")) == b"1"
    err = capfd.readouterr().err
    assert "hang: rank 0 waited 0 s in all_reduce_sum(float64[]) (hang timeout 0 s); " \
        "rank 1 has not reached it" in err  # fmt: skip
    assert 'File "train.py", line 9, in main' in err  # rank 1's stack, as it published it


def test_an_activity_within_the_timeout_raises_nothing() -> None:
    store = PrefixStore("hang/", HashStore())
    dog = make_dog(store, timeout=60)
    dog.begin("step 1: forward")
    dog.check_once()
    assert dog.exits == [] and not store.check(["alarm"])


def test_a_rank_answers_another_ranks_alarm_with_its_state() -> None:
    store = PrefixStore("hang/", HashStore())
    store.add("alarm", 1)
    store.set("reporter", "1")
    store.set("reported", "1")
    dog = make_dog(store, rank=0, timeout=60)
    dog.begin("step 4: backward + gradient all-reduce")
    dog.check_once()
    assert dog.exits == [HANG_EXIT_CODE]
    state = json.loads(bytes(store.get("state/0")))
    assert state["doing"] == "step 4: backward + gradient all-reduce"
    assert state["progress"] == 1 and state["stack"]


def test_a_second_rank_to_time_out_answers_instead_of_reporting_again(capfd) -> None:
    store = PrefixStore("hang/", HashStore())
    store.add("alarm", 1)  # another rank claimed the report a moment ago
    store.set("reported", "1")
    dog = make_dog(store, rank=1)
    dog.begin("step 2: forward")
    time.sleep(0.1)
    dog.check_once()
    assert "hang reported by another rank" in capfd.readouterr().err
    assert json.loads(bytes(store.get("state/1")))["doing"] == "step 2: forward"


def answering_dog(store, monkeypatch) -> Watchdog:
    """A running rank-0 dog that answers an alarm whose report never comes: it waits its
    deadline (grace + 2 polls, 2.4 s) for the report, then leaves."""
    monkeypatch.setattr(ddpkit.runtime.watchdog, "_STORE_OP_TIMEOUT_S", 0.05)
    store.add("alarm", 1)
    dog = make_dog(store, timeout=2)  # polls every 0.2 s
    dog.grace_s = 2.0
    dog.start()
    deadline = time.monotonic() + 10
    while not store.check(["state/0"]) and time.monotonic() < deadline:
        time.sleep(0.02)  # until it has published its answer and waits for the report
    return dog


def test_a_script_that_exits_during_an_answer_exits_with_the_hang_code(monkeypatch) -> None:
    # The reporter left, so this rank's collective failed and its script ends (the exit
    # handlers stop the watchdog): it leaves with the hang's code, not the echo's 1.
    dog = answering_dog(PrefixStore("hang/", HashStore()), monkeypatch)
    dog.stop()  # waits for the answer to end, past a poll's wait
    assert dog.exits == [HANG_EXIT_CODE]


def test_an_answer_that_outlasts_the_wait_still_ends_the_rank_with_the_hang_code(
    monkeypatch,
) -> None:
    dog = answering_dog(PrefixStore("hang/", HashStore()), monkeypatch)
    monkeypatch.setattr(dog, "_join_timeout_s", lambda: 0.05)
    dog.stop()
    assert dog.exits == [HANG_EXIT_CODE]  # from stop(), while the thread still waits


def test_without_a_store_a_single_process_still_reports_itself(capfd) -> None:
    dog = make_dog(None, world_size=1)
    dog.begin("step 7: loading the batch")
    time.sleep(0.1)
    dog.check_once()
    assert dog.exits == [HANG_EXIT_CODE]
    assert "hang: rank 0 waited 0 s in step 7: loading the batch" in capfd.readouterr().err


def test_nested_activities_restore_the_enclosing_one() -> None:
    dog = make_dog(None, timeout=60)
    outer = dog.begin("step 3: forward")
    inner = dog.begin("all_reduce_sum(float32[2])")
    dog.end(inner)
    assert dog.state()["doing"] == "step 3: forward"
    dog.end(outer)
    state = dog.state()
    assert state["doing"] is None and state["last"] == "step 3: forward"
    assert state["progress"] == 2


def test_the_training_position_is_what_a_rank_does_between_its_collectives() -> None:
    dog = make_dog(None, timeout=60)
    position = dog.position
    position.step, position.batches, position.since = 4, 1, time.monotonic() - 7
    position.stage = backward_stage(final=True, world_size=2)
    state = dog.state()
    assert state["doing"] == "step 4: backward + gradient all-reduce" and state["for_s"] >= 7
    inner = dog.begin("all_reduce_sum(float32[2])")  # a collective inside the step: its own
    assert dog.state()["doing"] == "all_reduce_sum(float32[2])"
    dog.end(inner)
    assert dog.state()["doing"] == "step 4: backward + gradient all-reduce"
    position.stage = OPTIMIZER_STEP
    position.idle()
    state = dog.state()
    assert state["doing"] is None and state["last"] == "step 4: optimizer step"
    # stages entered, with the collective: a rank a stage behind reads one less
    assert state["progress"] == STAGES_PER_BATCH + OPTIMIZER_STEP.order + 1


def test_a_batch_that_outlasts_the_timeout_is_reported_with_its_stage(capfd) -> None:
    dog = make_dog(None, world_size=1)
    dog.position.step, dog.position.stage, dog.position.since = 7, LOADING, time.monotonic()
    time.sleep(0.1)
    dog.check_once()
    assert dog.exits == [HANG_EXIT_CODE]
    assert "hang: rank 0 waited 0 s in step 7: loading the batch" in capfd.readouterr().err


def test_watch_is_a_no_op_without_a_running_watchdog() -> None:
    assert current_watchdog() is None
    ran = []
    with watch("anything"):
        ran.append(True)
    assert ran == [True]  # the block ran, nothing timed it, nothing was started
    assert current_watchdog() is None


def test_only_torch_and_ddpkit_files_are_library_frames() -> None:
    torch_dir = os.path.dirname(torch.__file__)
    assert is_hidden(os.path.join(torch_dir, "nn", "modules", "module.py"))
    assert is_hidden(ddpkit.runtime.watchdog.__file__)
    # A sibling whose name starts with "torch" is the user's code, not torch's.
    assert not is_hidden(torch_dir + "vision" + os.sep + "models" + os.sep + "resnet.py")
    assert not is_hidden(os.path.dirname(os.path.dirname(ddpkit.__file__)) + "x/train.py")


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_a_bad_hang_timeout_is_a_clear_error(value: str) -> None:
    with pytest.raises(ConfigError, match=r"DDPKIT_HANG_TIMEOUT='.*' must be a number of seconds"):
        resolve_hang_timeout(None, {"DDPKIT_HANG_TIMEOUT": value})
    with pytest.raises(ConfigError, match=r"hang_timeout \(0: off\) must be a number of seconds"):
        resolve_hang_timeout(float(value) if value != "soon" else value, {})  # type: ignore[arg-type]


def test_the_default_timeout_is_generous_and_zero_turns_it_off() -> None:
    assert resolve_hang_timeout(None, {}) == 600.0
    assert resolve_hang_timeout(2.5, {"DDPKIT_HANG_TIMEOUT": "9"}) == 2.5  # the argument wins
    assert start_watchdog(0, rank=0, world_size=1, store=None) is None


def test_the_stack_keeps_the_callers_own_frames() -> None:
    import threading

    stack = thread_stack(threading.get_ident())
    assert any("test_the_stack_keeps_the_callers_own_frames" in line for line in stack)


def states(*entries: tuple[str | None, int]) -> dict[int, dict[str, object]]:
    return {rank: json.loads(peer_state(doing, progress)) for rank, (doing, progress) in
            enumerate(entries)}  # fmt: skip


def test_report_names_ranks_behind_and_ranks_that_did_not_answer() -> None:
    found = states(("barrier()", 5), ("step 2: forward", 4))
    assert missing_ranks(found, world_size=3) == [1, 2]
    report = compose_report(found, world_size=3, reporter=0, timeout_s=30)
    assert "ranks 1,2 have not reached it" in report.splitlines()[0]
    assert "rank 2 did not answer within the grace period" in report


def test_report_calls_different_calls_at_the_same_point_a_mismatch() -> None:
    found = states(("all_reduce_sum(float32[3])", 5), ("all_reduce_sum(float32[4])", 5))
    report = compose_report(found, world_size=2, reporter=0, timeout_s=30)
    assert "collective mismatch: ranks wait in different calls" in report
    assert "--debug-collectives" in report


def test_report_calls_everyone_waiting_in_the_same_call_a_network_problem() -> None:
    found = states(("barrier()", 5), ("barrier()", 5))
    report = compose_report(found, world_size=2, reporter=1, timeout_s=30)
    assert "every rank waits in barrier()" in report and "doctor --smoke" in report


def test_a_stopped_watchdog_never_leaves_faulthandlers_timer_armed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An armed backstop outliving shutdown() would end the process ~10 minutes later."""
    armed: list[float] = []
    monkeypatch.setattr(faulthandler, "dump_traceback_later", lambda s, **_: armed.append(s))
    monkeypatch.setattr(faulthandler, "cancel_dump_traceback_later", armed.clear)
    dog = Watchdog(timeout_s=60, rank=0, world_size=1, store=None)
    dog.begin("step 1: forward")
    dog.check_once()
    assert armed  # a step is running: the backstop is set
    dog.stop()
    assert not armed
    dog.check_once()  # a poll that was already under way when stop() ran
    assert not armed


def test_a_rank_that_finished_is_named_in_the_report_of_the_rank_left_waiting(capfd) -> None:
    """NCCL's form of the classic mistake: rank 1 ended the script, rank 0 waits for ever in a
    collective rank 1 never called; on its way out rank 1 said it finished."""
    store = PrefixStore("hang/", HashStore())
    finished = make_dog(store, rank=1, timeout=60)
    for label in ("step 1", "step 2", "save"):  # further along than rank 0, and done
        finished.end(finished.begin(label))
    finished.stop(finished=True)
    waiting = make_dog(store, rank=0)
    waiting.begin("all_reduce_sum(float64[1]) at train.py:41")
    time.sleep(0.1)
    waiting.check_once()
    assert waiting.exits == [HANG_EXIT_CODE]
    err = capfd.readouterr().err
    assert (
        "hang: rank 0 waited 0 s in all_reduce_sum(float64[1]) at train.py:41 (hang timeout 0 s) "
        "but rank 1 finished the script without calling it: every rank must make the same "
        "collective calls in the same order" in err
    )
    assert "rank 1: finished the script (last ddpkit call: save)" in err


def test_a_watchdog_stopped_without_finishing_says_nothing() -> None:
    store = PrefixStore("hang/", HashStore())
    make_dog(store, rank=1, timeout=60).stop()  # a failing rank's teardown, say
    assert not store.check(["state/1"])


def test_the_report_names_the_collective_from_the_ranks_flight_recorders() -> None:
    from ddpkit.runtime.hangreport import compose_report

    def call(seq: int, done: bool) -> dict[str, object]:
        return {"seq": seq, "op": "all_reduce", "group": "default_pg", "sizes": [[110]],
                "dtypes": ["Float"], "done": done, "where": f"train.py:{seq} (main)",
                "purpose": "DDP gradient bucket"}  # fmt: skip

    states = {
        0: {"doing": "step 3", "for_s": 7.0, "progress": 9, "stack": [],
            "collectives": [call(7, True), call(8, False)]},
        1: {"doing": "step 3", "for_s": 7.0, "progress": 9, "stack": [],
            "collectives": [call(7, True)]},
    }  # fmt: skip
    lines = compose_report(states, 2, reporter=0, timeout_s=5).splitlines()
    assert lines[1] == (
        "collectives: rank 1 never issued all_reduce #8 of the default group (DDP gradient "
        "bucket, 110 float32); rank 0 waits in it since 7 s, called from train.py:8 (main); "
        "rank 1's last collective there was #7 at train.py:7 (main)"
    )
    assert lines[2].startswith("fix: the missing rank is elsewhere")
    assert not any("network" in line for line in lines)  # the activities alone would say so
