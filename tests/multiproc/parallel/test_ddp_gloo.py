"""Real 2-process gloo jobs started through ddpkit.spawn (torch's elastic launcher)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch

import ddpkit
from ddpkit import WorkerFailedError
from helpers import mp_workers
from helpers.launch_helpers import folder_names
from helpers.mp_workers import max_abs_diff

pytestmark = pytest.mark.multiproc


def test_spawn_gives_each_worker_its_world() -> None:
    results = ddpkit.spawn(mp_workers.world_fields, 2)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world_size"] == 2 and r["node_rank"] == 0 for r in results)
    assert [r["local_rank"] for r in results] == [0, 1]
    assert all(r["sum_of_ranks"] == 1.0 for r in results)  # a real all-reduce happened


def test_sampler_covers_every_index_once_and_reshuffles_per_epoch() -> None:
    n = 23  # odd on purpose: the sampler pads one sample to keep shards equal
    rank0, rank1 = ddpkit.spawn(mp_workers.sampler_indices, 2, n, 3)
    for epoch in range(3):
        seen = rank0[epoch] + rank1[epoch]
        assert len(rank0[epoch]) == len(rank1[epoch]) == 12
        assert sorted(set(seen)) == list(range(n))  # every index, none missing
        assert len(seen) - len(set(seen)) == 1  # exactly the one padded duplicate
    assert rank0[0] != rank0[1] != rank0[2]  # order changes per epoch


def test_two_workers_equal_one_process_with_twice_the_batch() -> None:
    per_device = 4
    distributed = ddpkit.spawn(mp_workers.sgd_steps, 2, per_device)  # 40 samples -> 5 steps
    single = mp_workers.sgd_steps(2 * per_device)  # this process: a world of one, 5 steps
    assert max_abs_diff(distributed[0], distributed[1]) == 0.0  # replicas identical
    assert max_abs_diff(distributed[0], single) <= 1e-6
    untrained = mp_workers.cpu_state(mp_workers.toy_model())
    assert max_abs_diff(single, untrained) > 1e-3  # the comparison is not vacuous


@pytest.mark.oldest_torch
def test_only_rank0_writes_and_resume_matches_uninterrupted_run(tmp_path: Path) -> None:
    full_dir, resumed_dir = tmp_path / "full", tmp_path / "resumed"
    full = ddpkit.spawn(mp_workers.train_with_checkpoints, 2, str(full_dir), 4, 2)
    assert [r["saved"] for r in full] == [[2, 4], []]  # rank 1 never writes
    assert folder_names(full_dir) == ["epoch_000002.pt", "epoch_000004.pt"]

    resumed_dir.mkdir()
    shutil.copy(full_dir / "epoch_000002.pt", resumed_dir)
    resumed = ddpkit.spawn(mp_workers.train_with_checkpoints, 2, str(resumed_dir), 4, 2)
    assert resumed[0]["saved"] == [4]  # it started at epoch 3, not from scratch
    for key, value in full[0]["state"].items():
        assert torch.equal(value, resumed[0]["state"][key]), key
    assert [h["loss"] for h in resumed[0]["history"]] == [h["loss"] for h in full[0]["history"]]


def test_checkpoint_loads_without_ddpkit_and_without_module_prefix(tmp_path: Path) -> None:
    ddpkit.spawn(mp_workers.train_with_checkpoints, 2, str(tmp_path), 1, 1)
    state = torch.load(tmp_path / "epoch_000001.pt", weights_only=True)
    model = mp_workers.toy_model()
    model.load_state_dict(state["model"])  # plain nn.Module: no "module." keys
    assert not any(k.startswith("module.") for k in state["model"])


def test_a_failing_worker_raises_its_error_and_stops_the_others() -> None:
    start = time.monotonic()
    with pytest.raises(WorkerFailedError) as caught:
        ddpkit.spawn(mp_workers.fail_on_rank, 2, 1)
    assert caught.value.rank == 1
    assert "ValueError: boom on rank 1" in caught.value.detail
    assert "Traceback" in caught.value.detail and "fail_on_rank" in caught.value.detail
    assert time.monotonic() - start < 60  # rank 0's barrier did not hang the job


def test_spawn_refuses_an_unpicklable_function() -> None:
    with pytest.raises(ddpkit.ConfigError, match="define the function at module level"):
        ddpkit.spawn(lambda: None, 2)


@pytest.mark.parametrize("shuffle", [False, True])
def test_evaluation_is_exact_when_the_data_does_not_divide(shuffle: bool) -> None:
    n = 7  # 2 ranks: the sampler pads one duplicate to make 4 + 4
    distributed = ddpkit.spawn(mp_workers.evaluate_toy, 2, n, shuffle)
    data = mp_workers.toy_dataset(n)
    with torch.no_grad():
        outputs = mp_workers.toy_model()(data.tensors[0])
    expected_loss = float(torch.nn.functional.cross_entropy(outputs, data.tensors[1]))
    expected_accuracy = float((outputs.argmax(1) == data.tensors[1]).sum()) / n
    for metrics in distributed:
        assert metrics["loss"] == pytest.approx(expected_loss, abs=1e-6)
        assert metrics["accuracy"] == pytest.approx(expected_accuracy, abs=1e-12)


def test_unused_parameters_error_names_them_and_the_fix() -> None:
    messages = ddpkit.spawn(mp_workers.train_two_heads, 2, False)
    for message in messages:
        assert "unused_head.weight, unused_head.bias" in message
        assert "find_unused_parameters=True" in message
    fixed = ddpkit.spawn(mp_workers.train_two_heads, 2, True)
    assert fixed == ["ok", "ok"]


def test_sync_batchnorm_on_cpu_says_it_needs_gpus() -> None:
    results = ddpkit.spawn(mp_workers.batchnorm_types, 2, True)
    assert all("sync_batchnorm=True needs CUDA devices" in str(r) for r in results)
    assert ddpkit.spawn(mp_workers.batchnorm_types, 2, False) == [["BatchNorm1d"]] * 2


@pytest.mark.parametrize("clip", [None, 0.05])
def test_accumulation_and_clipping_equal_one_large_batch(clip: float | None) -> None:
    # 2 workers x batch 1 x 4 micro-steps == 1 process x batch 8 (40 samples: 5 steps).
    distributed = ddpkit.spawn(mp_workers.sgd_steps_with, 2, 1, 4, clip)
    single = mp_workers.sgd_steps_with(8, 1, clip)
    assert max_abs_diff(distributed[0], distributed[1]) == 0.0
    assert max_abs_diff(distributed[0], single) <= 1e-6
    unclipped = mp_workers.sgd_steps_with(8, 1, None)
    if clip is not None:  # the clip really changed the result
        assert max_abs_diff(single, unclipped) > 1e-3
