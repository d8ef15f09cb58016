"""``strategy="hsdp"``, or :class:`HSDPStrategy` with options: hybrid sharding, FSDP2 on a
2-D mesh: shard within a node, replicate across nodes.

Plain FSDP all-gathers every unit's parameters from every rank of the job, so past one node
each layer's forward waits on the slowest link between hosts. HSDP shards the model over the
``shard`` ranks of a node only (fast links) and keeps one such sharded copy per node: the
all-gathers stay inside a node, and across nodes only the gradients travel, all-reduced
between replicas after each node's reduce-scatter. Memory per rank is that of FSDP over one
node; communication between nodes is that of DDP. It is FSDP2's ``fully_shard`` given a
(replicate, shard) DeviceMesh, as torchtitan builds it.

The shard size defaults to the workers per node (``LOCAL_WORLD_SIZE``) and is settable
(``prepare_model(model, HSDPStrategy(shard_size=2))``); it must divide the world size. Ranks
are laid out as the launchers number them: ``rank = replica * shard_size + shard``, so with the
default each node holds one replica. Checkpoints are FSDP's sharded ones (DCP): a run saved on
a 2x2 mesh resumes on another mesh, or as FSDP, at another world size.

Example:
    >>> hybrid_shape(world_size=4, shard_size=2)
    (2, 2)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from ddpkit._core.log import logger
from ddpkit.compiling.wrap import uncompiled
from ddpkit.errors import ConfigError
from ddpkit.parallel.base import checked_options
from ddpkit.parallel.fsdp import FSDPStrategy, shard_model
from ddpkit.parallel.options import bounded
from ddpkit.parallel.shardprecision import policy_text
from ddpkit.runtime.collectives import has_process_group

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ddpkit.env.world import World

MESH_DIMS = ("replicate", "shard")


@checked_options
@dataclass(frozen=True, repr=False, kw_only=True)
class HSDPStrategy(FSDPStrategy):
    """FSDP within each group of ``shard_size`` ranks, those groups replicas of each other.

    ``shard_size``: the ranks each replica is sharded over (None: the workers per node); the
    other options are :class:`~ddpkit.parallel.fsdp.FSDPStrategy`'s. The descriptor of a
    wrapped model knows its mesh's shape (``layout``).

    Example:
        >>> import ddpkit
        >>> ddpkit.HSDPStrategy(shard_size=2)
        HSDPStrategy(shard_size=2)
    """

    name = "hsdp"  # type: ignore[assignment]  # FSDP's is inferred as Literal["fsdp"]

    shard_size: int | None = bounded(None, least=1, means="ranks")
    shape: tuple[int, int] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()  # shard_size's type and range: checked_options

    @property
    def layout(self) -> str:
        if self.shape is None:
            return ""
        replicas, shards = self.shape
        mesh = f"{replicas} replica{'s' * (replicas > 1)} x {shards} shard{'s' * (shards > 1)}"
        return "; ".join(part for part in (mesh, policy_text(self.policy)) if part)

    def wrap(self, model: nn.Module, world: World) -> nn.Module:
        if not has_process_group():  # no job: whole, as FSDP leaves it
            return shard_model(model, world, self.units)
        check_backend(world.backend)
        default = world.local_world_size
        size = default if self.shard_size is None else self.shard_size
        shape = hybrid_shape(world.world_size, size)
        wrapped = self.shard(model, world, mesh=hybrid_mesh(world, shape))
        # strategy_of asks the model first: an HSDP model is an FSDP module too.
        wrapped.ddpkit_strategy = self._on_mesh(shape)  # type: ignore[assignment]
        logger.debug(f"hsdp mesh {shape} ({', '.join(MESH_DIMS)})")
        return wrapped

    def owns(self, model: nn.Module) -> bool:
        own = getattr(uncompiled(model), "ddpkit_strategy", None)
        return isinstance(own, HSDPStrategy)

    def _on_mesh(self, shape: tuple[int, int]) -> HSDPStrategy:
        """This strategy, knowing the mesh it was laid out on (not an option: set after)."""
        placed = copy.copy(self)
        object.__setattr__(placed, "shape", shape)
        return placed


def hybrid_shape(world_size: int, shard_size: int) -> tuple[int, int]:
    """(replicas, shards) of an HSDP mesh, or a ConfigError naming the sizes that fit.

    Example:
        >>> hybrid_shape(8, 4)
        (2, 4)
    """
    if not isinstance(shard_size, int) or isinstance(shard_size, bool) or shard_size < 1:
        raise ConfigError(f"shard_size must be a positive whole number; got {shard_size!r}")
    if world_size % shard_size:
        fits = [str(n) for n in range(1, world_size + 1) if world_size % n == 0]
        raise ConfigError(
            f"shard_size={shard_size} does not divide the world of {world_size} ranks: "
            f"each replica needs the same number of shards. Use one of {', '.join(fits)} "
            "(the default is the workers per node)"
        )
    return world_size // shard_size, shard_size


def check_backend(backend: str) -> None:
    """Refuse HSDP over gloo where the running torch's FSDP averages the replicas' gradients
    with ``ReduceOp.AVG``, which gloo lacks (torch 2.7: "Cannot use ReduceOp.AVG with Gloo"
    in the first backward; 2.13 runs it, tested). The torch that can also has
    ``set_force_sum_reduction_for_comms``, which tells them apart.

    Example:
        >>> check_backend("nccl")
    """
    from torch.distributed.fsdp import FSDPModule

    if backend == "gloo" and not hasattr(FSDPModule, "set_force_sum_reduction_for_comms"):
        raise ConfigError(
            f"strategy='hsdp' over gloo needs a newer torch than {torch.__version__}: its FSDP "
            "averages the replicas' gradients with ReduceOp.AVG, which gloo lacks (torch "
            "2.13 runs it). On CPU use strategy='fsdp', or HSDP over NCCL on GPUs"
        )


def hybrid_mesh(world: World, shape: tuple[int, int]) -> DeviceMesh:
    """The (replicate, shard) DeviceMesh over every rank of the job (a collective).

    Example::

        mesh = hybrid_mesh(world, (2, 2))   # ranks 0,1 shard one replica, 2,3 the other
    """
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(world.device.type, shape, mesh_dim_names=MESH_DIMS)


HSDP = HSDPStrategy()  # strategy="hsdp"
