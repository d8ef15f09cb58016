"""ddpkit plan's parts without a process: the ring bound, the plan's record, the report, the
options refused, and the collective log over torch's fake process group in this process."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ddpkit._compat.fakepg import join_fake_world
from ddpkit.errors import ConfigError
from ddpkit.tools.plan.command import _check, add_arguments, report
from ddpkit.tools.plan.costs import Collective, Kind, Link, Memory, Plan, ring_seconds
from ddpkit.tools.plan.recorder import CollectiveLog, PlanRecorder

GB = 1e9


@pytest.mark.parametrize(
    ("kind", "expected"),
    [  # 1 GB over 8 ranks on a 1 GB/s link with 1 ms a hop
        (Kind.ALL_REDUCE, 2 * 7 / 8 + 14e-3),
        (Kind.ALL_GATHER, 7 / 8 + 7e-3),
        (Kind.REDUCE_SCATTER, 7 / 8 + 7e-3),
        (Kind.BROADCAST, 1.0 + 7e-3),
    ],
)
def test_the_ring_bound_of_each_kind(kind: Kind, expected: float) -> None:
    call = Collective(kind, int(GB), group_size=8, step=1, source="x")
    assert ring_seconds(call, Link(bandwidth=GB, latency=1e-3)) == pytest.approx(expected)


def test_a_group_of_one_sends_nothing() -> None:
    assert ring_seconds(Collective(Kind.ALL_REDUCE, 10**9, 1, 1, "x"), Link(1.0, 1.0)) == 0.0


def test_a_plan_keeps_its_kinds_through_json_and_reports_its_last_step() -> None:
    calls = [
        Collective(Kind.BROADCAST, 400, 4, 0, "c10d.broadcast_"),
        Collective(Kind.ALL_REDUCE, 100, 4, 1, "DDP bucket 0"),
        Collective(Kind.ALL_REDUCE, 100, 4, 2, "DDP bucket 0"),
        Collective(Kind.ALL_GATHER, 8, 4, 2, "c10d.allgather_"),
    ]
    plan = Plan(4, 4, "ddp", 2, 25, Memory(100, 100, 200, 100), calls)
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert [c.source for c in again.per_step()] == ["DDP bucket 0", "c10d.allgather_"]
    text = report(again, Link(25e9, 5e-6), "train.py")
    assert "as rank 0 of 4 ranks (4 per node x 1 node), DDP, 2 step(s)" in text
    assert "all-reduce         1 x       100   B in all, over groups of 4: 0.03 ms" in text
    assert "total                  500   B  (activations not counted)" in text
    assert "set-up (once): 1 collective(s),      400   B" in text


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--world", "0"], "--world 0: the world needs at least 1 rank"),
        (["--world", "12"], "--world 12 is not a whole number of nodes of --nproc-per-node 8"),
        (["--world", "8", "--steps", "0"], "--steps 0: the dry run needs at least 1 step"),
        (["--world", "8", "--bandwidth", "0"], "--bandwidth must be above 0 GB/s"),
    ],
)
def test_numbers_that_make_no_world_are_refused(argv: list[str], said: str) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ConfigError, match=said):
        _check(parser.parse_args([*argv, "train.py"]))


def test_a_small_world_is_one_node_by_default() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert _check(parser.parse_args(["--world", "4", "train.py"])) == 4
    assert _check(parser.parse_args(["--world", "64", "train.py"])) == 8


@pytest.fixture
def fake_world() -> object:
    join_fake_world(rank=0, world_size=16)
    yield
    dist.destroy_process_group()


@pytest.mark.usefixtures("fake_world")
def test_the_log_sizes_each_collective_as_the_ring_bound_counts_it() -> None:
    """An all-gather by its output, a reduce-scatter by its input, an all-reduce by its
    tensor; each with its group's size (a subgroup of 4 is not the world of 16)."""
    node = dist.new_group(list(range(4)))
    shard = torch.ones(10)
    with CollectiveLog() as log:
        log.step = 3
        dist.all_reduce(shard)
        dist.all_gather_into_tensor(torch.empty(40), shard, group=node)
        dist.reduce_scatter_tensor(shard, torch.ones(40), group=node)
        dist.barrier()
    seen = [(c.kind, c.bytes, c.group_size, c.step) for c in log.calls]
    assert seen == [
        (Kind.ALL_REDUCE, 40, 16, 3),
        (Kind.ALL_GATHER, 160, 4, 3),
        (Kind.REDUCE_SCATTER, 160, 4, 3),
    ]


def test_a_recorder_writes_nothing_before_training() -> None:
    recorder = PlanRecorder(Path("/nonexistent"))
    assert recorder.plan is None and recorder.log.calls == []
