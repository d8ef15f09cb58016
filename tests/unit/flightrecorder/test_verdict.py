"""The collective-level verdict from the ranks' Flight Recorders, and reading dumps as plain
data only (no processes)."""

from __future__ import annotations

import json
import pickle
from collections import OrderedDict
from pathlib import Path

import pytest

from ddpkit._core.torchversion import torch_at_least
from ddpkit.flightrecorder.arming import flight_recorder_defaults
from ddpkit.flightrecorder.records import compact, load_dump, recent_collectives
from ddpkit.flightrecorder.verdict import Cause, collective_verdict
from ddpkit.tools.doctor.dumps import explain_dumps


def call(seq: int, size: int = 110, done: bool = True, op: str = "all_reduce", **more: object):
    return {"seq": seq, "op": op, "group": "default_pg", "sizes": [[size]], "dtypes": ["Float"],
            "done": done, "where": f"train.py:{seq} (main)", **more}  # fmt: skip


def test_a_rank_behind_is_named_with_the_collective_and_both_lines() -> None:
    states = {0: {"collectives": [call(36), call(37, done=False)], "for_s": 12.0},
              1: {"collectives": [call(35), call(36)]}}  # fmt: skip
    verdict = collective_verdict(states, 2)
    assert verdict is not None and verdict.cause is Cause.MISSING
    assert verdict.line == (
        "rank 1 never issued all_reduce #37 of the default group (110 float32); rank 0 waits in "
        "it since 12 s, called from train.py:37 (main); rank 1's last collective there was #36 "
        "at train.py:36 (main)"
    )


def test_ranks_at_the_same_collective_with_other_sizes_disagree() -> None:
    states = {0: {"collectives": [call(5, size=7, done=False)]},
              1: {"collectives": [call(5, size=9, done=False)]}}  # fmt: skip
    verdict = collective_verdict(states, 2)
    assert verdict is not None and verdict.cause is Cause.DISAGREE
    assert "rank 0 all_reduce (7 float32) at train.py:5 (main), rank 1 all_reduce (9 float32)" in (
        verdict.line
    )


def test_a_silent_rank_and_a_stuck_collective() -> None:
    waiting = {"collectives": [call(8, done=False, purpose="DDP gradient bucket")], "for_s": 9}
    silent = collective_verdict({0: waiting}, world_size=2)
    assert silent is not None and silent.cause is Cause.SILENT
    assert silent.line.startswith(
        "rank 0 waits in all_reduce #8 of the default group (DDP gradient bucket, 110 float32)"
    )
    stuck = collective_verdict({0: waiting, 1: {**waiting}}, world_size=2)
    assert stuck is not None and stuck.cause is Cause.STUCK and "doctor --nodes" in stuck.fix
    done = {"collectives": [call(8)]}
    assert collective_verdict({0: done, 1: done}, 2) is None  # nothing pending: Python code


def test_a_rank_aborted_by_gloo_means_the_ranks_disagree() -> None:
    states = {0: {"collectives": [call(4, size=9)]}, 1: {"collectives": []}}
    verdict = collective_verdict(states, 2, pending_only=False, aborted=(1,))
    assert verdict is not None and verdict.cause is Cause.DISAGREE
    assert "rank 1 aborted (SIGABRT)" in verdict.line


def test_flight_recorder_entries_are_compacted_and_dumps_read_as_plain_data(tmp_path: Path) -> None:
    entry = {"collective_seq_id": 3, "profiling_name": "gloo:all_reduce", "input_sizes": [[110]],
             "input_dtypes": ["Float"], "process_group": ["0", "default_pg"], "retired": False,
             "frames": [{"name": "main", "filename": "/home/u/train.py", "line": 14}]}  # fmt: skip
    assert compact(entry)["where"] == "train.py:14 (main)"
    assert recent_collectives({"entries": [entry] * 9})[-1]["seq"] == 3
    assert len(recent_collectives({"entries": [entry] * 9})) == 4  # the last few per group
    assert load_dump(pickle.dumps({"entries": [entry]}))["entries"][0]["input_sizes"] == [[110]]
    with pytest.raises(pickle.UnpicklingError, match="refused: the dump names collections"):
        load_dump(pickle.dumps(OrderedDict(entries=[])))  # a class: could run code
    (tmp_path / "trace_rank_0").write_bytes(pickle.dumps(OrderedDict(entries=[])))
    (tmp_path / "trace_rank_1.json").write_text(json.dumps({"entries": [entry]}))
    report = explain_dumps(tmp_path)
    assert report[0].startswith("1 dump(s)")
    assert any(line.startswith("  refused trace_rank_0: refused") for line in report)


def test_the_recorder_is_armed_unless_asked_not_to_or_already_set() -> None:
    # torch 2.8 and later read TORCH_FR_BUFFER_SIZE; torch 2.7 TORCH_NCCL_TRACE_BUFFER_SIZE
    name = "TORCH_FR_BUFFER_SIZE" if torch_at_least("2.8") else "TORCH_NCCL_TRACE_BUFFER_SIZE"
    assert flight_recorder_defaults({}) == {name: "2000"}
    assert flight_recorder_defaults({"DDPKIT_FLIGHT_RECORDER": "off"}) == {name: "0"}
    assert flight_recorder_defaults({"TORCH_NCCL_TRACE_BUFFER_SIZE": "100"}) == {}


def test_a_live_dump_reads_nccls_recorder_and_the_shared_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # NCCL's groups record apart from gloo's (found on the first GPU run: reading only the
    # shared recorder left an NCCL job's hang report without its collectives)
    from torch._C import _distributed_c10d

    from ddpkit.flightrecorder import records as flightrec

    def entry(group: str, op: str) -> dict[str, object]:
        return {"collective_seq_id": 1, "profiling_name": op, "process_group": ["0", group],
                "input_sizes": [[3]], "input_dtypes": ["Float"], "frames": []}  # fmt: skip

    nccl = pickle.dumps({"entries": [entry("default_pg", "nccl:all_reduce")]})
    shared = pickle.dumps({"entries": [entry("cpu_side", "gloo:broadcast")]})
    monkeypatch.setattr(_distributed_c10d, "_dump_nccl_trace", lambda *a: nccl, raising=False)
    monkeypatch.setattr(_distributed_c10d, "_dump_fr_trace", lambda *a: shared, raising=False)
    found = {(c["group"], c["op"]) for c in recent_collectives()}
    assert found == {("default_pg", "all_reduce"), ("cpu_side", "broadcast")}
    assert flightrec.dump() is not None
