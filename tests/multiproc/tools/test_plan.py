"""`ddpkit plan` against a real run: the dry run of 4 ranks in one process over torch's fake
process group says what a real 4-rank gloo job's rank 0 holds and sends, within 5%.

The real job's witness is torch's own: its parameters', gradients' and optimizer state's local
bytes read by the script with plain torch calls, and the collectives of each step from torch's
Flight Recorder (tests/scripts/plan_witness.py), never ddpkit plan's recorder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers.launch_helpers import ddpkit_cli

pytestmark = pytest.mark.multiproc

STEPS = 3
_ITEM_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4}


def flight_recorder_sizes(entries: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(kind, S) of each collective the Flight Recorder kept, S as ddpkit plan counts it: an
    all-gather's output, anything else's input."""
    calls = []
    for entry in entries:
        kind = entry["profiling_name"].split(":")[-1]
        shapes = entry["output_sizes"] if kind.startswith("all_gather") else entry["input_sizes"]
        dtypes = entry["output_dtypes"] if kind.startswith("all_gather") else entry["input_dtypes"]
        count = 0
        for shape, dtype in zip(shapes, dtypes, strict=True):
            numel = 1
            for length in shape:
                numel *= length
            count += numel * _ITEM_BYTES[dtype]
        calls.append((kind, count))
    return sorted(calls)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_dry_run_of_4_ranks_says_what_a_real_4_rank_run_holds_and_sends(
    strategy: str, tmp_path: Path
) -> None:
    real = tmp_path / "real.json"
    done = ddpkit_cli("run", "--nproc", "4", "tests/scripts/plan_witness.py", str(real),
                      strategy, env={"DDPKIT_MAX_STEPS": str(STEPS)}, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    planned = tmp_path / "plan.json"
    done = ddpkit_cli("plan", "--world", "4", "--nproc-per-node", "4", "--steps", str(STEPS),
                      "--json", str(planned), "tests/scripts/plan_witness.py",
                      str(tmp_path / "unused.json"), strategy, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"as rank 0 of 4 ranks (4 per node x 1 node), {strategy.upper()}" in done.stdout
    witness, plan = json.loads(real.read_text()), json.loads(planned.read_text())
    for item in ("parameters", "gradients", "optimizer"):
        assert witness[item] > 0
        assert plan["memory"][item] == pytest.approx(witness[item], rel=0.05), item
    sent = flight_recorder_sizes(witness["steps"][str(STEPS)])
    said = sorted((c["kind"], c["bytes"]) for c in plan["collectives"] if c["step"] == STEPS)
    assert sent and len(said) == len(sent), (said, sent)
    # gloo carries out a reduce-scatter as an all-reduce of the whole input (which its
    # Flight Recorder records); the fake group, like NCCL, as a reduce-scatter
    as_gloo_does = {"reduce_scatter": "all_reduce"}
    assert sorted(as_gloo_does.get(kind, kind) for kind, _ in said) == [k for k, _ in sent]
    kinds_of = lambda calls: sorted(calls, key=lambda c: (as_gloo_does.get(c[0], c[0]), c[1]))  # noqa: E731
    for (kind, planned_bytes), (_, real_bytes) in zip(kinds_of(said), sent, strict=True):
        assert planned_bytes == pytest.approx(real_bytes, rel=0.05), (kind, said, sent)


def test_a_world_that_is_not_whole_nodes_is_refused_before_anything_runs() -> None:
    done = ddpkit_cli("plan", "--world", "100", "--nproc-per-node", "8", "examples/wine.py")
    assert done.returncode == 2, done.stderr
    assert "--world 100 is not a whole number of nodes of --nproc-per-node 8" in done.stderr
