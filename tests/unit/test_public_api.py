"""The public face grows on purpose: ``ddpkit.__all__`` and the keywords of the calls a
training script makes are pinned here. A change to either fails this test until the pin
changes with it, in the same commit, so a new name or option is a decision, not a side effect.

Every loop keyword is visible to ``inspect.signature`` and ``help()`` with its default (a
script that looks an option up by name works), and that default is the one the loop uses.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import fields
from pathlib import Path

import pytest

import ddpkit
from ddpkit.errors import RemovedNameError
from ddpkit.train.options import CheckpointOptions, LogOptions, LoopKeywords, LoopOptions

PUBLIC_NAMES = {
    "ActivationCheckpointing", "BatchPlan", "Callback", "CheckpointError",
    "CollectiveMismatchError", "ConfigError", "DDPStrategy", "DdpkitError", "ExperimentLog",
    "FSDPStrategy", "HSDPStrategy", "MLflowLogger", "MainRankStalledError",
    "NotInitializedError", "RendezvousError", "ReplicaDivergenceError", "ReplicaGroups",
    "Tracker", "TrainLoop",
    "Trainer", "WandbLogger", "WorkerFailedError", "World", "__version__", "all_gather",
    "all_reduce_mean", "all_reduce_sum", "barrier", "current_world",
    "gather_for_metrics", "get_rank", "init", "is_main", "main_first", "plan_batch",
    "prepare_loader", "prepare_model", "print0", "rank_zero_only", "sample_generator",
    "seed_everything", "shutdown", "spawn", "to_device", "unwrap_model", "watch",
}  # fmt: skip

LOOP_KEYWORDS = [
    "save_every", "save_every_steps", "keep_last", "async_save", "accumulate", "precision",
    "clip_grad_norm", "nonfinite_loss", "check_replicas_every", "replica_groups", "log_every",
    "log_dir", "loggers", "profile",
]  # fmt: skip

KEYWORDS = {
    "init": ["backend", "timeout", "init_method", "rank", "world_size", "join_timeout", "seed",
             "hang_timeout"],
    "prepare_model": ["model", "strategy", "sync_batchnorm", "compile",
                      "activation_checkpointing", "weights"],
    "prepare_loader": ["dataset", "batch_size", "shuffle", "batch_policy", "uneven", "seed",
                       "loader_kwargs"],
    "Trainer": ["model", "optimizer", "loss_fn", "checkpoint_dir", "training_step",
                "validation_step", "manual_optimization", "state", "callbacks", "scheduler",
                "scheduler_interval", *LOOP_KEYWORDS],
    "TrainLoop": ["state", "checkpoint_dir", "callbacks", *LOOP_KEYWORDS],
    "spawn": ["fn", "nprocs", "args", "nnodes", "node_rank", "master"],
}  # fmt: skip

# Each strategy's options, on its object (``prepare_model(model, ddpkit.FSDPStrategy(...))``).
STRATEGY_OPTIONS = {
    "DDPStrategy": ["bucket_cap_mb", "find_unused_parameters", "static_graph",
                    "gradient_as_bucket_view", "broadcast_buffers", "comm_hook"],
    "FSDPStrategy": ["units", "mixed_precision", "reshard_after_forward"],
    "HSDPStrategy": ["units", "mixed_precision", "reshard_after_forward", "shard_size"],
    "ActivationCheckpointing": ["blocks", "every"],
    "ReplicaGroups": ["group", "lighthouse", "min_groups", "timeout", "quorum_retries",
                      "bucket_cap_mb"],
}  # fmt: skip


def test_the_top_level_names_are_the_pinned_ones() -> None:
    added, removed = set(ddpkit.__all__) - PUBLIC_NAMES, PUBLIC_NAMES - set(ddpkit.__all__)
    assert not added and not removed, f"__all__ changed: added {added}, removed {removed}"
    assert all(hasattr(ddpkit, name) for name in ddpkit.__all__)


@pytest.mark.parametrize("name", sorted(KEYWORDS))
def test_the_keywords_of_each_call_are_the_pinned_ones(name: str) -> None:
    assert list(inspect.signature(getattr(ddpkit, name)).parameters) == KEYWORDS[name]


@pytest.mark.parametrize("name", sorted(STRATEGY_OPTIONS))
def test_the_options_of_each_strategy_are_the_pinned_ones(name: str) -> None:
    assert list(inspect.signature(getattr(ddpkit, name)).parameters) == STRATEGY_OPTIONS[name]


def test_every_public_name_is_in_the_rendered_reference() -> None:
    # docs/reference.md renders each by its defining module's path (make docs, strict)
    text = (Path(__file__).resolve().parents[2] / "docs" / "reference.md").read_text()
    rendered = set(re.findall(r"^::: ([\w.]+)$", text, re.MULTILINE))
    missing = [
        name
        for name in ddpkit.__all__
        if name != "__version__"
        and not {getattr(ddpkit, name).__module__, f"{getattr(ddpkit, name).__module__}.{name}"}
        & rendered
    ]
    assert not missing, f"docs/reference.md renders no ::: entry for {missing}"


def test_offline_tools_live_in_their_subpackage() -> None:
    import ddpkit.checkpoint

    assert "export_checkpoint" in ddpkit.checkpoint.__all__ and "export_checkpoint" not in dir(
        ddpkit
    )


def test_a_removed_name_answers_with_its_replacement_and_is_still_an_attribute_error() -> None:
    with pytest.raises(RemovedNameError, match=r"ddpkit.export_checkpoint was removed: use "
                       r"ddpkit.checkpoint.export_checkpoint"):  # fmt: skip
        ddpkit.export_checkpoint  # noqa: B018
    assert not hasattr(ddpkit, "export_checkpoint")  # hasattr sees an AttributeError


def test_the_checkpoint_package_exports_only_what_users_call() -> None:
    import ddpkit.checkpoint

    assert {"atomic_write", "INVALID_SUFFIX"}.isdisjoint(ddpkit.checkpoint.__all__)
    assert {"save_checkpoint", "load_checkpoint", "checkpoint_folder"} <= set(
        ddpkit.checkpoint.__all__
    )


def test_the_pinned_loop_keywords_are_the_loops_own() -> None:
    assert list(LoopKeywords.__annotations__) == LOOP_KEYWORDS


@pytest.mark.parametrize("face", ["Trainer", "TrainLoop"])
def test_each_loop_keyword_shows_the_default_the_loop_uses(face: str) -> None:
    shown = inspect.signature(getattr(ddpkit, face)).parameters
    groups = (CheckpointOptions, LoopOptions, LogOptions)
    used = {f.name: f.default for group in groups for f in fields(group)}
    for name in LOOP_KEYWORDS:
        assert shown[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert shown[name].default == used[name], name
    assert "async_save" in str(inspect.signature(getattr(ddpkit, face)))
