"""Strategies and training features, each against the single-process computation it stands for.

Every test runs 2 gloo workers on loopback through ddpkit.spawn (torch's elastic launcher).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import ddpkit
from helpers import strategy_workers as workers
from helpers.launch_helpers import folder_names
from helpers.mp_workers import max_abs_diff

pytestmark = pytest.mark.multiproc


def test_fsdp_and_ddp_with_clipping_match_one_process() -> None:
    ddp = ddpkit.spawn(workers.train_toy, 2, "ddp", 4)
    fsdp = ddpkit.spawn(workers.train_toy, 2, "fsdp", 4)
    single = workers.train_toy("none", 8)  # this process: a world of one, the global batch
    unclipped = workers.train_toy("none", 8, clip=None)
    assert max_abs_diff(ddp[0], ddp[1]) == 0.0 and max_abs_diff(fsdp[0], fsdp[1]) == 0.0
    assert max_abs_diff(fsdp[0], ddp[0]) <= 1e-5
    assert max_abs_diff(ddp[0], single) <= 1e-5
    assert max_abs_diff(single, unclipped) > 1e-3  # the clip changed the result


def test_fsdp_sharded_checkpoint_resumes_to_the_same_parameters(tmp_path: Path) -> None:
    full_dir, resumed_dir = tmp_path / "full", tmp_path / "resumed"
    full = ddpkit.spawn(workers.train_toy, 2, "fsdp", 4, 4, 0.05, str(full_dir), 2)
    written = folder_names(full_dir)
    assert written == ["epoch_000002.dcp", "epoch_000004.dcp"]  # no temporary left behind
    assert {"__0_0.distcp", "__1_0.distcp"} <= {p.name for p in (full_dir / written[0]).iterdir()}

    resumed_dir.mkdir()
    shutil.copytree(full_dir / "epoch_000002.dcp", resumed_dir / "epoch_000002.dcp")
    resumed = ddpkit.spawn(workers.train_toy, 2, "fsdp", 4, 4, 0.05, str(resumed_dir), 2)
    assert max_abs_diff(full[0], resumed[0]) == 0.0
    fresh = ddpkit.spawn(workers.train_toy, 2, "fsdp", 4, 2)  # half the training
    assert max_abs_diff(full[0], fresh[0]) > 1e-3  # so resuming really skipped two epochs


@pytest.mark.oldest_torch  # DCP's asynchronous save answers differently in torch 2.7
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_fsdp_resumes_mid_epoch_from_verified_shards(tmp_path: Path, async_save: bool) -> None:
    args = ("fsdp", 4, 3, 0.05)  # 5 steps per epoch
    full = ddpkit.spawn(workers.train_toy, 2, *args, str(tmp_path / "full"), None, False, 2)
    cut = (*args, str(tmp_path / "cut"), None, False, 2)
    with pytest.raises(ddpkit.WorkerFailedError, match="crash before step 8"):
        ddpkit.spawn(workers.train_toy, 2, *cut, 8, async_save)
    newest = folder_names(tmp_path / "cut")[-1]
    assert newest == "epoch_000002_step_000006.dcp"  # keep_last=3 kept 2, 4 and 6
    resumed = ddpkit.spawn(workers.train_toy, 2, *cut, None, async_save)
    assert max_abs_diff(full[0], resumed[0]) == 0.0  # a synchronous run's, bit for bit


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_every_rank_starts_from_rank0_weights(strategy: str) -> None:
    rank0, rank1 = ddpkit.spawn(workers.initial_weights, 2, strategy)
    assert max_abs_diff(rank0, rank1) == 0.0
    assert max_abs_diff(rank0, workers.full_state(workers.toy_model(seed=100))) == 0.0


def test_compression_hooks_train_wine_to_the_same_accuracy() -> None:
    hooks = [None, "fp16", "bf16", "powersgd"]
    results = ddpkit.spawn(workers.wine_accuracy, 2, hooks, 60)[0]
    baseline_accuracy, baseline_loss = results[0]
    assert baseline_accuracy >= 0.9, results
    for hook, (accuracy, loss) in zip(hooks[1:], results[1:], strict=True):
        assert abs(accuracy - baseline_accuracy) <= 0.02, (hook, results)
        assert loss != baseline_loss, (hook, results)  # the hook really changed the traffic


def test_bf16_autocast_trains_wine_on_cpu() -> None:
    accuracy, _ = ddpkit.spawn(workers.wine_accuracy, 2, [None], 60, "bf16")[0][0]
    assert accuracy >= 0.9


def test_global_batch_policy_equals_one_process_with_that_batch() -> None:
    distributed = ddpkit.spawn(workers.sgd_with_policy, 2, 64, "global")
    single = workers.sgd_with_policy(64, "global")
    assert max_abs_diff(distributed[0]["state"], single["state"]) <= 1e-6
    assert distributed[0]["plan"] == ddpkit.BatchPlan(32, 64, 64, 0.1, "global", "linear")  # x1
    line = distributed[0]["startup"]
    assert "global batch 64 = 32 per device x 2 ranks (batch_policy=global); lr 0.1" in line
    per_device = ddpkit.spawn(workers.sgd_with_policy, 2, 64, "per_device")[0]
    assert per_device["plan"] == ddpkit.BatchPlan(64, 128, 64, 0.2, "per_device", "linear")  # x2


def test_augmentation_streams_differ_per_rank_and_repeat_per_seed() -> None:
    first = ddpkit.spawn(workers.augmentation_draws, 2, 5)
    again = ddpkit.spawn(workers.augmentation_draws, 2, 5)
    assert first == again  # one seed reproduces the run
    assert first[0]["workers"] != first[1]["workers"]  # loader workers: per-rank seeds
    assert first[0]["main"] != first[1]["main"]  # main process after fit starts: per rank


def test_uneven_batch_counts_finish_under_join_and_count_every_sample() -> None:
    results = ddpkit.spawn(workers.uneven_batches, 2, "ddp")  # 5 batches vs 3: no hang
    for result in results:
        assert isinstance(result, dict)
        assert len(result["history"]) == 2
    assert max_abs_diff(results[0]["state"], results[1]["state"]) == 0.0  # replicas agree
    messages = ddpkit.spawn(workers.uneven_batches, 2, "fsdp")
    assert all("FSDP needs the same number of batches" in m for m in messages)
    assert all("between 3 and 5" in m for m in messages)


def test_impossible_requests_are_refused_with_the_fix() -> None:
    messages = ddpkit.spawn(workers.strategy_errors, 2)[0]
    assert 'use strategy="ddp"' in messages["dp"] and "2 processes" in messages["dp"]
    assert messages["hook_on_fsdp"].startswith("prepare_model() no longer takes comm_hook")
    assert "ddpkit.DDPStrategy(comm_hook='bf16')) (comm_hook belongs to DDPStrategy, not to " \
        "'fsdp')" in messages["hook_on_fsdp"]  # fmt: skip
    assert "FSDPStrategy has no option 'comm_hook' (DDPStrategy has)" in messages[
        "hook_on_fsdp_object"]  # fmt: skip
    assert "does not divide; use a multiple of 2 (e.g. 8)" in messages["global_odd"]


@pytest.mark.parametrize(("uneven", "note"), [("pad", "repeated"), ("drop", "left out")])
def test_the_startup_line_says_how_uneven_data_is_handled(uneven: str, note: str) -> None:
    line = ddpkit.spawn(workers.sgd_with_policy, 2, 10, "per_device", 41, uneven)[0]["startup"]
    assert line.startswith("training DDP; global batch 20 = 10 per device x 2 ranks")
    assert f'1 sample {note} so the 2 shards are equal (uneven="{uneven}")' in line


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_every_optimizer_resumes_from_the_checkpoint_bit_for_bit(
    strategy: str, tmp_path: Path
) -> None:
    runs = ddpkit.spawn(workers.two_optimizers_resumed, 2, strategy, str(tmp_path))[0]
    assert max_abs_diff(runs["straight"], runs["resumed"]) == 0.0
