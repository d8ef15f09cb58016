"""ddpkit: distributed data-parallel training for PyTorch, one script from 1 CPU to M nodes.

Example:
    >>> import ddpkit
    >>> world = ddpkit.init()               # a world of one without a launcher
    ddpkit: world size 1 ...
    >>> world.world_size, ddpkit.is_main()
    (1, True)
    >>> ddpkit.shutdown()
"""

from ddpkit.data.loader import BatchPlan, plan_batch, prepare_loader
from ddpkit.env.world import World
from ddpkit.errors import (
    CheckpointError,
    CollectiveMismatchError,
    ConfigError,
    DdpkitError,
    NotInitializedError,
    RendezvousError,
    ReplicaDivergenceError,
    WorkerFailedError,
)
from ddpkit.launch.launcher import spawn
from ddpkit.parallel.strategy import prepare_model, unwrap_model
from ddpkit.runtime.collectives import (
    all_reduce_mean,
    all_reduce_sum,
    barrier,
    get_rank,
    is_main,
    print0,
    rank_zero_only,
)
from ddpkit.runtime.seeding import seed_everything
from ddpkit.runtime.session import current_world, init, shutdown
from ddpkit.runtime.watchdog import watch
from ddpkit.train.trainer import Trainer

__version__ = "0.1.0"

__all__ = [
    "BatchPlan",
    "CheckpointError",
    "CollectiveMismatchError",
    "ConfigError",
    "DdpkitError",
    "NotInitializedError",
    "RendezvousError",
    "ReplicaDivergenceError",
    "Trainer",
    "WorkerFailedError",
    "World",
    "__version__",
    "all_reduce_mean",
    "all_reduce_sum",
    "barrier",
    "current_world",
    "get_rank",
    "init",
    "is_main",
    "plan_batch",
    "prepare_loader",
    "prepare_model",
    "print0",
    "rank_zero_only",
    "seed_everything",
    "shutdown",
    "spawn",
    "unwrap_model",
    "watch",
]
