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
import zlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal, get_args

import torch

from ddpkit._core.envvars import int_var
from ddpkit._core.protocol import DEFAULT_MASTER_PORT
from ddpkit.env.kubernetes import Controller, detect_pod_job, pod_topology_fields
from ddpkit.env.slurm import (
    check_started_by_srun,
    slurm_first_host,
    slurm_port,
    slurm_tasks_on_node,
)
from ddpkit.errors import ConfigError

Backend = Literal["gloo", "nccl", "mpi"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)
# Said in the start line where ranks came from a cluster manager rather than a ddpkit launcher.
_RANK_SOURCES = {
    "slurm": ", ranks from SLURM_PROCID",
    "mpi": ", ranks from OMPI_COMM_WORLD_RANK",
    **{c.value: f", ranks from the {c.label} (one process per pod)" for c in Controller},
}


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
    # torch elastic's agent hosts the store at MASTER_PORT; rank 0 must not start another.
    agent_store: bool = False
    restart: int = 0  # how often torch's agent has restarted the workers (--max-restarts)
    max_restarts: int = 0


@dataclass(frozen=True)
class World(Topology):
    """This process's place in the job: a frozen value, detected once by ``ddpkit.init()``.

    ``rank`` is the global rank (0 .. world_size-1); ``local_rank`` indexes the process on its
    node (and its GPU); ``node_rank`` is the node's index; ``launcher`` names the contract the
    world was read from (``"torchrun"``, or ``"none"`` for a plain single process).

    Example:
        >>> w = World(rank=3, local_rank=1, world_size=4, local_world_size=2, node_rank=1)
        >>> w.is_main, w.num_nodes
        (False, 2)
    """

    # The topology's fields come from Topology; the world adds where this rank computes.
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: Backend = "gloo"

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
        restarted = f", restart {self.restart} of {self.max_restarts}" if self.restart else ""
        source = _RANK_SOURCES.get(self.launcher, "")
        return (
            f"world size {self.world_size} ({self.local_world_size} process"
            f"{'es' if self.local_world_size > 1 else ''} per node x {self.num_nodes} node"
            f"{'s' if self.num_nodes > 1 else ''}), backend {self.backend}, device {self.device}"
            + restarted
            + source
        )

    @classmethod
    def detect(
        cls,
        environ: Mapping[str, str] | None = None,
        backend: Backend | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> World:
        """Read the world from the launcher's environment and choose device and backend.

        Example:
            >>> env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
            ...        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
            >>> World.detect(env).rank
            1
        """
        env = os.environ if environ is None else environ
        if rank is None and world_size is None:
            topology = detect_topology(env)
        else:
            topology = explicit_topology(rank, world_size, env)
        device = choose_device(topology.local_rank)
        return cls(**asdict(topology), device=device, backend=choose_backend(backend, device))


def detect_topology(env: Mapping[str, str]) -> Topology:
    """Ranks and sizes from the first launcher contract present: torchrun, a Kubernetes
    controller's (:mod:`ddpkit.env.kubernetes`), SLURM, OpenMPI.

    A worker of torch's launcher wins: ``srun ddpkit run`` workers carry SLURM's variables
    too, and a PyTorchJob pod's RANK / WORLD_SIZE, but their ranks are the ones ``ddpkit
    run`` assigned. A PyTorchJob's own RANK is the pod's, read as one process per pod.

    Example:
        >>> detect_topology({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}).launcher
        'mpi'
    """
    detectors: tuple[Callable[[Mapping[str, str]], Topology | None], ...]
    detectors = (_pod_topology, _torchrun_topology, _slurm_topology, _mpi_topology)
    if "TORCHELASTIC_RUN_ID" in env:  # a worker of torch's launcher (ddpkit run, torchrun)
        detectors = (_torchrun_topology,)
    for detector in detectors:
        topology = detector(env)
        if topology is not None:
            _validate_ranks(topology)
            _validate_master(topology)
            return topology
    return Topology()


def explicit_topology(rank: int | None, world_size: int | None, env: Mapping[str, str]) -> Topology:
    """Ranks given in code, as the tutorials pass them with ``--dist-url`` (tcp:// or file://).

    Processes are assumed to share one node unless LOCAL_WORLD_SIZE says otherwise.

    Example:
        >>> explicit_topology(1, 2, {}).local_rank
        1
    """
    if rank is None or world_size is None:
        raise ConfigError(
            f"rank and world_size go together (got rank={rank}, world_size={world_size}); "
            "pass both, or neither to read them from the launcher"
        )
    local_world_size = int_var(env, "LOCAL_WORLD_SIZE", default=world_size)
    topology = Topology(
        rank=rank,
        local_rank=int_var(env, "LOCAL_RANK", default=rank % max(1, local_world_size)),
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=rank // max(1, local_world_size),
        master_addr=env.get("MASTER_ADDR"),
        master_port=int_var(env, "MASTER_PORT") if "MASTER_PORT" in env else None,
        launcher="explicit",
    )
    _validate_ranks(topology)
    return topology


def _torchrun_topology(env: Mapping[str, str]) -> Topology | None:
    if not _contract_present(env, ("RANK", "WORLD_SIZE"), "torchrun"):
        return None
    rank, world_size = int_var(env, "RANK"), int_var(env, "WORLD_SIZE")
    local_world_size = int_var(env, "LOCAL_WORLD_SIZE", default=world_size)
    return Topology(
        rank=rank,
        local_rank=int_var(env, "LOCAL_RANK", default=rank % max(1, local_world_size)),
        world_size=world_size,
        local_world_size=local_world_size,
        # GROUP_RANK is torch elastic's node index; plain env:// jobs only give ranks.
        node_rank=int_var(env, "GROUP_RANK", default=rank // max(1, local_world_size)),
        master_addr=env.get("MASTER_ADDR"),
        master_port=int_var(env, "MASTER_PORT") if "MASTER_PORT" in env else None,
        launcher="torchrun",
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        restart=int_var(env, "TORCHELASTIC_RESTART_COUNT", default=0),
        max_restarts=int_var(env, "TORCHELASTIC_MAX_RESTARTS", default=0),
    )


def _pod_topology(env: Mapping[str, str]) -> Topology | None:
    """A process started directly in a Kubernetes training pod (``python train.py``)."""
    job = detect_pod_job(env)
    if job is None or (job.nnodes is None and job.node_rank == 0):
        return None  # pod 0 of a job that does not say its size: a world of one
    return Topology(**pod_topology_fields(job))


def _slurm_topology(env: Mapping[str, str]) -> Topology | None:
    """One SLURM task per worker (``srun -n 8 python train.py``)."""
    if not _contract_present(env, ("SLURM_PROCID", "SLURM_NTASKS"), "SLURM"):
        return None
    check_started_by_srun(env)
    node = int_var(env, "SLURM_NODEID", default=0)
    tasks_here = slurm_tasks_on_node(env, node)
    return Topology(
        rank=int_var(env, "SLURM_PROCID"),
        local_rank=int_var(env, "SLURM_LOCALID", default=0),
        world_size=int_var(env, "SLURM_NTASKS"),
        local_world_size=tasks_here,
        node_rank=node,
        master_addr=env.get("MASTER_ADDR") or slurm_first_host(env),
        master_port=int_var(env, "MASTER_PORT", default=slurm_port(env)),
        launcher="slurm",
    )


def _mpi_topology(env: Mapping[str, str]) -> Topology | None:
    """OpenMPI's ranks (``mpirun -np 2 python train.py``)."""
    prefix = "OMPI_COMM_WORLD_"
    if not _contract_present(env, (prefix + "RANK", prefix + "SIZE"), "OpenMPI"):
        return None
    size = int_var(env, prefix + "SIZE")
    local_size = int_var(env, prefix + "LOCAL_SIZE", default=size)
    single_node = local_size == size
    return Topology(
        rank=int_var(env, prefix + "RANK"),
        local_rank=int_var(env, prefix + "LOCAL_RANK", default=0),
        world_size=size,
        local_world_size=local_size,
        # OMPI_COMM_WORLD_NODE_RANK is a process's rank *on* its node, not the node's index;
        # OpenMPI publishes no node index, so it follows from the (uniform) layout.
        node_rank=int_var(env, prefix + "RANK") // max(1, local_size),
        # One node: every rank can reach rank 0 on loopback. Several: the user must say where.
        master_addr=env.get("MASTER_ADDR") or ("127.0.0.1" if single_node else None),
        master_port=int_var(env, "MASTER_PORT", default=_job_port(env.get("PMIX_NAMESPACE"))),
        launcher="mpi",
    )


def _contract_present(env: Mapping[str, str], required: tuple[str, ...], name: str) -> bool:
    present = [var for var in required if var in env]
    if not present:
        return False
    missing = [var for var in required if var not in env]
    if missing:
        raise ConfigError(
            f"{', '.join(present)} is set but {', '.join(missing)} is not: a {name}-launched "
            "process needs both. Start the job with its launcher (`ddpkit run`, torchrun, "
            f"srun, mpirun), or unset {', '.join(present)} to run as a single process."
        )
    return True


def _job_port(job_key: str | None) -> int:
    """A port all ranks of one job agree on without talking: derived from a job-unique key."""
    if not job_key:
        return DEFAULT_MASTER_PORT
    return 20000 + zlib.crc32(job_key.encode()) % 10000


def _validate_ranks(t: Topology) -> None:
    size, local_size = t.world_size, t.local_world_size
    if size < 1 or local_size < 1:
        raise ConfigError(f"world size {size} and processes per node {local_size} must be >= 1")
    if not 0 <= t.rank < size:
        raise ConfigError(
            f"rank {t.rank} is outside 0..{size - 1} (world size {size}, from {t.launcher})"
        )
    if not 0 <= t.local_rank < local_size:
        raise ConfigError(
            f"local rank {t.local_rank} is outside 0..{local_size - 1} "
            f"({local_size} processes per node)"
        )
    nodes = -(-size // local_size)
    if not 0 <= t.node_rank < nodes:
        raise ConfigError(
            f"node rank {t.node_rank} is outside 0..{nodes - 1}: world size {size} / "
            f"{local_size} processes per node = {nodes} node(s)"
        )


def _validate_master(t: Topology) -> None:
    if t.world_size > 1 and (t.master_addr is None or t.master_port is None):
        raise ConfigError(
            f"world size {t.world_size} ({t.launcher}) but MASTER_ADDR/MASTER_PORT are not set: "
            "rank 0's address is needed to meet. Launch with `ddpkit run` (it sets them) or "
            "export both (mpirun: -x MASTER_ADDR -x MASTER_PORT)."
        )
    if t.master_port is not None and not 0 < t.master_port < 65536:
        raise ConfigError(f"MASTER_PORT={t.master_port} is not a TCP port (1..65535)")


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


def choose_backend(requested: str | None, device: torch.device) -> Backend:
    """nccl for CUDA devices, gloo otherwise, unless a backend is requested by name.

    Example:
        >>> choose_backend(None, torch.device("cpu"))
        'gloo'
    """
    if requested is None:
        return "nccl" if device.type == "cuda" else "gloo"
    backend = next((b for b in BACKENDS if b == requested), None)  # a name mypy knows
    if backend is None:
        raise ConfigError(f"unknown backend {requested!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "nccl" and device.type != "cuda":
        raise ConfigError(
            "backend 'nccl' needs CUDA GPUs, and none is available here; use backend='gloo' "
            "for CPU training"
        )
    return backend
