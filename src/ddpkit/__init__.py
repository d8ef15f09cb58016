"""ddpkit: distributed data-parallel training for PyTorch, one script from 1 CPU to M nodes.

The public API is imported on first use (``ddpkit.init`` imports the process-group session,
``ddpkit.Trainer`` the training loop), so ``import ddpkit`` itself costs almost nothing: the
workers ``ddpkit run`` starts, and plain torchrun scripts among them, pay only for what they
use.

Example:
    >>> import ddpkit
    >>> world = ddpkit.init()               # a world of one without a launcher
    ddpkit: world size 1 ...
    >>> world.world_size, ddpkit.is_main()
    (1, True)
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ddpkit.errors import (
    CheckpointError,
    CollectiveMismatchError,
    ConfigError,
    DdpkitError,
    MainRankStalledError,
    NotInitializedError,
    RendezvousError,
    ReplicaDivergenceError,
    WorkerFailedError,
)

if TYPE_CHECKING:
    from ddpkit.data.batches import to_device
    from ddpkit.data.loader import BatchPlan, plan_batch, prepare_loader
    from ddpkit.data.metricsgather import gather_for_metrics
    from ddpkit.data.samples import sample_generator
    from ddpkit.env.world import World
    from ddpkit.faulttolerance.groups import ReplicaGroups
    from ddpkit.launch.launcher import spawn
    from ddpkit.observe.explog import ExperimentLog
    from ddpkit.observe.trackers import MLflowLogger, Tracker, WandbLogger
    from ddpkit.parallel.ddp import DDPStrategy
    from ddpkit.parallel.fsdp import FSDPStrategy
    from ddpkit.parallel.hsdp import HSDPStrategy
    from ddpkit.parallel.recompute import ActivationCheckpointing
    from ddpkit.parallel.strategy import prepare_model, unwrap_model
    from ddpkit.runtime.allgather import all_gather
    from ddpkit.runtime.callbacks import Callback
    from ddpkit.runtime.collectives import (
        all_reduce_mean,
        all_reduce_sum,
        barrier,
        get_rank,
        is_main,
        print0,
        rank_zero_only,
    )
    from ddpkit.runtime.mainfirst import main_first
    from ddpkit.runtime.seeding import seed_everything
    from ddpkit.runtime.session import current_world, init, shutdown
    from ddpkit.runtime.watchdog import watch
    from ddpkit.train.loop import TrainLoop
    from ddpkit.train.trainer import Trainer

__version__ = "0.1.0"

# Public name -> the module that defines it, imported when the name is first used.
_LAZY = {
    "to_device": "ddpkit.data.batches",
    "gather_for_metrics": "ddpkit.data.metricsgather",
    "BatchPlan": "ddpkit.data.loader",
    "plan_batch": "ddpkit.data.loader",
    "prepare_loader": "ddpkit.data.loader",
    "sample_generator": "ddpkit.data.samples",
    "World": "ddpkit.env.world",
    "ReplicaGroups": "ddpkit.faulttolerance.groups",
    "spawn": "ddpkit.launch.launcher",
    "DDPStrategy": "ddpkit.parallel.ddp",
    "FSDPStrategy": "ddpkit.parallel.fsdp",
    "HSDPStrategy": "ddpkit.parallel.hsdp",
    "ActivationCheckpointing": "ddpkit.parallel.recompute",
    "prepare_model": "ddpkit.parallel.strategy",
    "unwrap_model": "ddpkit.parallel.strategy",
    "all_reduce_mean": "ddpkit.runtime.collectives",
    "all_reduce_sum": "ddpkit.runtime.collectives",
    "barrier": "ddpkit.runtime.collectives",
    "get_rank": "ddpkit.runtime.collectives",
    "is_main": "ddpkit.runtime.collectives",
    "print0": "ddpkit.runtime.collectives",
    "rank_zero_only": "ddpkit.runtime.collectives",
    "all_gather": "ddpkit.runtime.allgather",
    "main_first": "ddpkit.runtime.mainfirst",
    "seed_everything": "ddpkit.runtime.seeding",
    "current_world": "ddpkit.runtime.session",
    "init": "ddpkit.runtime.session",
    "shutdown": "ddpkit.runtime.session",
    "watch": "ddpkit.runtime.watchdog",
    "Callback": "ddpkit.runtime.callbacks",
    "ExperimentLog": "ddpkit.observe.explog",
    "TrainLoop": "ddpkit.train.loop",
    "MLflowLogger": "ddpkit.observe.trackers",
    "Tracker": "ddpkit.observe.trackers",
    "WandbLogger": "ddpkit.observe.trackers",
    "Trainer": "ddpkit.train.trainer",
}


# Public names that moved or went, each answered with what replaced it.
_REMOVED = {"export_checkpoint": "ddpkit.checkpoint.export_checkpoint (an offline tool)"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        # ddpkit.checkpoint, ddpkit.reporting, ...: a submodule asked for as an attribute.
        if name in ("checkpoint", "reporting"):
            return importlib.import_module(f"ddpkit.{name}")
        if name in _REMOVED:  # an error naming the replacement, an AttributeError too
            from ddpkit._core.renamed import removed_name

            raise removed_name("ddpkit", name, _REMOVED[name])
        raise AttributeError(f"module 'ddpkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next look-up is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "ActivationCheckpointing",
    "BatchPlan",
    "Callback",
    "CheckpointError",
    "CollectiveMismatchError",
    "ConfigError",
    "DDPStrategy",
    "DdpkitError",
    "ExperimentLog",
    "FSDPStrategy",
    "HSDPStrategy",
    "MLflowLogger",
    "MainRankStalledError",
    "NotInitializedError",
    "RendezvousError",
    "ReplicaDivergenceError",
    "ReplicaGroups",
    "Tracker",
    "TrainLoop",
    "Trainer",
    "WandbLogger",
    "WorkerFailedError",
    "World",
    "__version__",
    "all_gather",
    "all_reduce_mean",
    "all_reduce_sum",
    "barrier",
    "current_world",
    "gather_for_metrics",
    "get_rank",
    "init",
    "is_main",
    "main_first",
    "plan_batch",
    "prepare_loader",
    "prepare_model",
    "print0",
    "rank_zero_only",
    "sample_generator",
    "seed_everything",
    "shutdown",
    "spawn",
    "to_device",
    "unwrap_model",
    "watch",
]
