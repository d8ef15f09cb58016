"""Who am I in this job? The world: ranks, sizes, node, device and backend.

This is the only module that reads topology from ``os.environ``. Launchers publish the world
through environment variables (torchrun's contract: RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); with none present the process is a world of one,
which is not a special mode, just ``world_size == 1``.

Example:
    >>> w = World.detect(environ={})
    >>> (w.rank, w.world_size, w.is_main, w.launcher)
    (0, 1, True, 'none')
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import torch

from ddpkit.errors import ConfigError

BACKENDS = ("gloo", "nccl", "mpi")

# torchrun's contract. RANK and WORLD_SIZE are what identify a launched process; the rest
# either come with them or can be derived.
_TORCHRUN_REQUIRED = ("RANK", "WORLD_SIZE")


@dataclass(frozen=True)
class Topology:
    """Ranks and sizes as a launcher publishes them; :class:`World` adds device and backend.

    Example:
        >>> Topology().world_size
        1
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    launcher: str = "none"


@dataclass(frozen=True)
class World:
    """This process's place in the job: a frozen value, detected once by ``ddpkit.init()``.

    ``rank`` is the global rank (0 .. world_size-1); ``local_rank`` indexes the process on its
    node (and its GPU); ``node_rank`` is the node's index; ``launcher`` names the contract the
    world was read from (``"torchrun"``, or ``"none"`` for a plain single process).

    Example:
        >>> w = World(rank=3, local_rank=1, world_size=4, local_world_size=2, node_rank=1)
        >>> w.is_main, w.num_nodes
        (False, 2)
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = "gloo"
    master_addr: str | None = None
    master_port: int | None = None
    launcher: str = "none"

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the process that logs and writes checkpoints."""
        return self.rank == 0

    @property
    def num_nodes(self) -> int:
        """Number of nodes, assuming the same number of processes on each."""
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def is_launched(self) -> bool:
        """True when a launcher started this process (a process group is expected)."""
        return self.launcher != "none"

    def describe(self) -> str:
        """One line for logs: sizes, backend and device.

        Example:
            >>> World().describe()
            'world size 1 (1 process per node x 1 node), backend gloo, device cpu'
        """
        return (
            f"world size {self.world_size} ({self.local_world_size} process"
            f"{'es' if self.local_world_size > 1 else ''} per node x {self.num_nodes} node"
            f"{'s' if self.num_nodes > 1 else ''}), backend {self.backend}, device {self.device}"
        )

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None, backend: str | None = None) -> World:
        """Read the world from the launcher's environment and choose device and backend.

        Example:
            >>> env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
            ...        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
            >>> World.detect(env).rank
            1
        """
        env = os.environ if environ is None else environ
        topology = _torchrun_topology(env) or Topology()
        device = choose_device(topology.local_rank)
        return cls(**asdict(topology), device=device, backend=choose_backend(backend, device))


def _torchrun_topology(env: Mapping[str, str]) -> Topology | None:
    present = [name for name in _TORCHRUN_REQUIRED if name in env]
    if not present:
        return None
    missing = [name for name in _TORCHRUN_REQUIRED if name not in env]
    if missing:
        raise ConfigError(
            f"{', '.join(present)} is set but {', '.join(missing)} is not: a launched process "
            "needs both. Start the job with `ddpkit run` or torchrun, or unset "
            f"{', '.join(present)} to run as a single process."
        )
    rank, world_size = _int_var(env, "RANK"), _int_var(env, "WORLD_SIZE")
    local_world_size = _int_var(env, "LOCAL_WORLD_SIZE", default=world_size)
    local_rank = _int_var(env, "LOCAL_RANK", default=rank % max(1, local_world_size))
    master_port = _int_var(env, "MASTER_PORT") if "MASTER_PORT" in env else None
    _validate_ranks(rank, world_size, local_rank, local_world_size)
    _validate_master(world_size, env.get("MASTER_ADDR"), master_port)
    return Topology(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        # GROUP_RANK is torch elastic's node index; plain env:// jobs only give ranks.
        node_rank=_int_var(env, "GROUP_RANK", default=rank // local_world_size),
        master_addr=env.get("MASTER_ADDR"),
        master_port=master_port,
        launcher="torchrun",
    )


def _int_var(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None:
        if default is None:
            raise ConfigError(f"environment variable {name} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def _validate_ranks(rank: int, size: int, local_rank: int, local_size: int) -> None:
    if size < 1 or local_size < 1:
        raise ConfigError(f"WORLD_SIZE={size} and LOCAL_WORLD_SIZE={local_size} must be >= 1")
    if not 0 <= rank < size:
        raise ConfigError(f"RANK={rank} is outside 0..{size - 1} (WORLD_SIZE={size})")
    if not 0 <= local_rank < local_size:
        raise ConfigError(
            f"LOCAL_RANK={local_rank} is outside 0..{local_size - 1} "
            f"(LOCAL_WORLD_SIZE={local_size})"
        )


def _validate_master(size: int, addr: str | None, port: int | None) -> None:
    if size > 1 and (addr is None or port is None):
        raise ConfigError(
            f"WORLD_SIZE={size} but MASTER_ADDR/MASTER_PORT are not set: rank 0's address "
            "is needed to meet. Launch with `ddpkit run` (it sets them) or export both."
        )
    if port is not None and not 0 < port < 65536:
        raise ConfigError(f"MASTER_PORT={port} is not a TCP port (1..65535)")


def choose_device(local_rank: int) -> torch.device:
    """The device this rank trains on: ``cuda:<local_rank>`` when CUDA is available, else CPU.

    Example:
        >>> choose_device(0).type in ("cpu", "cuda")
        True
    """
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise ConfigError(
            f"LOCAL_RANK={local_rank} but only {count} GPU(s) are visible on this node: "
            f"start at most {count} processes per node (--nproc {count}) or check "
            "CUDA_VISIBLE_DEVICES."
        )
    return torch.device("cuda", local_rank)


def choose_backend(requested: str | None, device: torch.device) -> str:
    """nccl for CUDA devices, gloo otherwise, unless a backend is requested by name.

    Example:
        >>> choose_backend(None, torch.device("cpu"))
        'gloo'
    """
    if requested is None:
        return "nccl" if device.type == "cuda" else "gloo"
    if requested not in BACKENDS:
        raise ConfigError(f"unknown backend {requested!r}; choose one of {', '.join(BACKENDS)}")
    if requested == "nccl" and device.type != "cuda":
        raise ConfigError(
            "backend 'nccl' needs CUDA GPUs, and none is available here; use backend='gloo' "
            "for CPU training"
        )
    return requested
