"""From launcher flags to a torch ``LaunchConfig``: one node, static nodes, elastic nodes;
and the environment each node's workers start with (:func:`worker_env_defaults`).

- one node (default): ddpkit's loopback rendezvous, port chosen at bind time;
- static multi-node (``--nnodes 2 --node-rank R --master ADDR:PORT``): torch's ``static``
  rendezvous, the tutorials' MASTER_ADDR / MASTER_PORT / node_rank scheme;
- dynamic / elastic (``--rdzv-endpoint HOST:PORT --rdzv-id ID --nnodes MIN:MAX``): torch's
  ``c10d`` rendezvous; node ranks are assigned as nodes arrive.

Every inconsistency is a ConfigError that shows the numbers.

Example:
    >>> LaunchPlan(nproc=4, nnodes="2", node_rank=1, master="10.0.0.1:29500").mode
    'static'
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.api import LogsSpecs
from torch.distributed.launcher.api import LaunchConfig

from ddpkit._core.protocol import FORWARDED_SIGNALS, LIGHTHOUSE_ENV
from ddpkit._core.system import interface_toward, loopback_interface, threads_per_worker
from ddpkit._core.text import parse_endpoint
from ddpkit._core.validate import check_positive_int
from ddpkit.env.kubernetes import PodJob
from ddpkit.env.slurm import SlurmNodes
from ddpkit.errors import ConfigError
from ddpkit.launch.loopback import register_loopback_backend

RDZV_TIMEOUT_S = 900  # how long nodes may take to join; torch's default
# torch's agent catches these and stops its workers with the same signal (the protocol's
# FORWARDED_SIGNALS, in torch's spelling).
SIGNALS_TO_HANDLE = ",".join(FORWARDED_SIGNALS)


@dataclass(frozen=True)
class LaunchPlan:
    """What ``ddpkit run`` / ``ddpkit.spawn`` start, checked on construction.

    Example:
        >>> LaunchPlan(nproc=2).mode
        'local'
    """

    nproc: int = 1
    nnodes: str = "1"
    node_rank: int | None = None
    master: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    max_restarts: int = 0
    local_addr: str | None = None
    # torchrun's other knobs, with torchrun's defaults
    rdzv_conf: dict[str, str] = field(default_factory=dict)
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    role: str = "default"
    log_dir: str | None = None  # kept after the job, as torchrun keeps it
    redirects: str = "0"  # torchrun's Std values: 0 none, 1 stdout, 2 stderr, 3 both
    tee: str = "0"
    local_ranks_filter: tuple[int, ...] = ()
    merge_output: bool = True  # ddpkit run: lines printed alike by several ranks, once
    merge_window: float = 0.5  # seconds a line waits for the same line of other ranks
    contract: str | None = None  # where the nodes came from, said at start (a pod's controller)
    memory_snapshots: bool = True  # with restarts: workers keep each step in /dev/shm

    def __post_init__(self) -> None:
        check_nproc(self.nproc)
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be >= 0 (got {self.max_restarts})")
        if self.master and self.rdzv_endpoint:
            raise ConfigError("pass --master (static) or --rdzv-endpoint (dynamic), not both")
        _check_mode_flags(self, *parse_nnodes(self.nnodes))
        _std(self.redirects, "--redirects")
        _std(self.tee, "--tee")

    @property
    def mode(self) -> str:
        """'local', 'static' or 'dynamic'."""
        if self.master:
            return "static"
        return "dynamic" if self.rdzv_endpoint else "local"

    @property
    def merges_output(self) -> bool:
        """Whether ``ddpkit run`` merges the workers' lines: on, unless turned off or the
        torchrun flags that choose where output goes (--redirects, --tee, --local-ranks-filter)
        are given."""
        chosen = self.redirects != "0" or self.tee != "0" or bool(self.local_ranks_filter)
        return self.merge_output and not chosen

    @property
    def node_range(self) -> tuple[int, int]:
        """(min, max) number of nodes."""
        return parse_nnodes(self.nnodes)


def check_nproc(nproc: object) -> None:
    """Reject a process count that cannot work, naming the value.

    Example:
        >>> check_nproc(0)
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: --nproc must be a positive integer (got 0)
    """
    check_positive_int("--nproc", nproc)


def parse_nnodes(text: str) -> tuple[int, int]:
    """``"2"`` -> (2, 2); ``"1:4"`` -> (1, 4) (elastic).

    Example:
        >>> parse_nnodes("1:4")
        (1, 4)
    """
    low, _, high = str(text).partition(":")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        raise ConfigError(f"--nnodes {text!r} is not N or MIN:MAX (like 2 or 1:4)") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise ConfigError(f"--nnodes {text!r} needs 1 <= MIN <= MAX")
    return bounds


def _check_mode_flags(plan: LaunchPlan, low: int, high: int) -> None:
    if plan.mode == "static":
        parse_endpoint(plan.master, "--master")
        if low != high:
            raise ConfigError(
                f"--nnodes {plan.nnodes} is elastic, which --master (static) cannot do; use "
                "--rdzv-endpoint HOST:PORT --rdzv-id ID for an elastic job"
            )
        if plan.node_rank is None or not 0 <= plan.node_rank < low:
            raise ConfigError(
                f"--node-rank {plan.node_rank} is outside 0..{low - 1} (--nnodes {low}); "
                "give each node its index, 0 on the master's node"
            )
    elif plan.mode == "dynamic":
        parse_endpoint(plan.rdzv_endpoint, "--rdzv-endpoint")
        if plan.node_rank is not None:
            raise ConfigError("--node-rank is for --master; --rdzv-endpoint assigns node ranks")
    elif high > 1:
        raise ConfigError(
            f"--nnodes {plan.nnodes} needs to know where nodes meet: --master ADDR:PORT with "
            "--node-rank (static), or --rdzv-endpoint HOST:PORT (dynamic)"
        )


def plan_from_slurm(plan: LaunchPlan, job: SlurmNodes) -> LaunchPlan:
    """Fill a plan from a SLURM step with one task per node (``srun ddpkit run``).

    Example:
        >>> job = SlurmNodes(nnodes=2, node_rank=1, ntasks=2, master_addr="n1", master_port=21000)
        >>> plan_from_slurm(LaunchPlan(nproc=4), job).master
        'n1:21000'
    """
    if job.ntasks != job.nnodes:
        raise ConfigError(
            f"this SLURM step has {job.ntasks} tasks on {job.nnodes} node(s); `ddpkit run` "
            "wants one task per node (#SBATCH --ntasks-per-node=1) and starts the workers "
            "itself. With one task per GPU, run `srun python train.py` instead."
        )
    if job.nnodes == 1:
        return plan
    master = f"{job.master_addr}:{job.master_port}"
    return replace(plan, nnodes=str(job.nnodes), node_rank=job.node_rank, master=master)


def plan_from_pod(plan: LaunchPlan, job: PodJob, nnodes_flag: str | None = None) -> LaunchPlan:
    """Fill a plan from a Kubernetes controller's contract (``ddpkit run`` as the pod's
    command): static at node 0's name, or torch's c10d rendezvous there when elastic.

    ``nnodes_flag`` (``--nnodes`` given on the command line) wins over the controller's.

    Example:
        >>> from ddpkit.env.kubernetes import Controller
        >>> job = PodJob(Controller.TRAINJOB, "m", "2", 1, "4", "m-node-0-0.m", 29500)
        >>> plan_from_pod(LaunchPlan(nproc=4), job).master
        'm-node-0-0.m:29500'
    """
    nnodes = nnodes_flag or job.nnodes
    if nnodes is None:
        raise ConfigError(
            f"{job.describe()}; nothing says how many pods the job has: pass --nnodes N "
            "(or set PET_NNODES in the pod spec; `ddpkit k8s` writes it)"
        )
    contract = replace(job, nnodes=nnodes).describe()
    if ":" in nnodes or job.node_rank is None:  # elastic: ranks are assigned as pods arrive
        return replace(plan, nnodes=nnodes, node_rank=None, master=None, contract=contract,
                       rdzv_endpoint=job.master, rdzv_id=plan.rdzv_id or job.name)  # fmt: skip
    if parse_nnodes(nnodes)[0] == 1:
        return replace(plan, contract=contract)
    return replace(plan, nnodes=nnodes, node_rank=job.node_rank, master=job.master,
                   rdzv_endpoint=None, contract=contract)  # fmt: skip


def to_launch_config(
    plan: LaunchPlan, log_dir: str, logs_specs: LogsSpecs | None = None
) -> LaunchConfig:
    """torch's LaunchConfig for ``plan``; ``log_dir`` receives the workers' error files
    (and their output, by ``logs_specs``: default, as torchrun's flags say).

    Example:
        >>> to_launch_config(LaunchPlan(nproc=2), "/tmp").rdzv_backend
        'ddpkit-loopback'
    """
    low, high = plan.node_range
    backend, endpoint, configs = _rendezvous(plan)
    return LaunchConfig(
        logs_specs=logs_specs
        or DefaultLogsSpecs(
            log_dir=log_dir,
            redirects=_std(plan.redirects, "--redirects"),
            tee=_std(plan.tee, "--tee"),
            local_ranks_filter=set(plan.local_ranks_filter) or None,
        ),
        role=plan.role,
        min_nodes=low,
        max_nodes=high,
        nproc_per_node=plan.nproc,
        run_id=run_id(plan),
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_configs={"timeout": RDZV_TIMEOUT_S, **configs, **plan.rdzv_conf},
        local_addr=plan.local_addr,
        max_restarts=plan.max_restarts,
        monitor_interval=plan.monitor_interval,
        start_method=plan.start_method,
        **_signal_options(),
    )


def _signal_options() -> dict[str, Any]:
    # torch < 2.10 has no signals_to_handle: its agent forwards SIGTERM, SIGINT, SIGHUP and
    # SIGQUIT, and the launcher adds SIGUSR1 itself (launcher._forward_sigusr1).
    known = {f.name for f in dataclasses.fields(LaunchConfig)}
    return {"signals_to_handle": SIGNALS_TO_HANDLE} if "signals_to_handle" in known else {}


def _std(value: str, flag: str) -> Std | dict[int, Std]:
    """torchrun's ``0``-``3`` or per-rank ``0:1,1:2`` form, as torch's Std."""
    try:
        return Std.from_str(value)
    except ValueError as err:
        raise ConfigError(f"{flag} {value!r}: {err} (0 none, 1 stdout, 2 stderr, 3 both)") from None


def run_id(plan: LaunchPlan) -> str:
    """The rendezvous id: shared by every node of a job, unique for a one-node job.

    The agents of different nodes only meet under the same id (it prefixes their store
    keys), so a multi-node default must be the same everywhere, as torchrun's is.

    Example:
        >>> run_id(LaunchPlan(nnodes="2", node_rank=0, master="h:1"))
        'ddpkit'
    """
    if plan.rdzv_id:
        return plan.rdzv_id
    return f"ddpkit-{uuid.uuid4().hex[:12]}" if plan.mode == "local" else "ddpkit"


def _rendezvous(plan: LaunchPlan) -> tuple[str, str, dict[str, object]]:
    if plan.mode == "static":
        return "static", str(plan.master), {"rank": plan.node_rank}
    if plan.mode == "dynamic":
        return "c10d", str(plan.rdzv_endpoint), {}
    return register_loopback_backend(), "", {}


def worker_env_defaults(plan: LaunchPlan) -> dict[str, str]:
    """Environment defaults for this node's workers; variables the user already set are kept.

    OMP_NUM_THREADS splits the cores between workers (oversubscribed threads make CPU
    training slower, not faster); on a one-node job GLOO_SOCKET_IFNAME keeps gloo's traffic
    on loopback, or puts it on the route to a replica groups' lighthouse on another host
    (TORCHFT_LIGHTHOUSE), over which the groups exchange gradients. Under dynamic rendezvous
    each round of workers gets a store of its own (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, read
    by torch's rendezvous in this process): the store shared across rounds keeps the
    previous round's keys, and after a host leaves or joins, a worker could read its peer's
    old address and fail to connect (pytorch#135712).

    Example:
        >>> defaults = worker_env_defaults(LaunchPlan(nproc=2))
        >>> "OMP_NUM_THREADS" in defaults or "OMP_NUM_THREADS" in os.environ
        True
    """
    defaults = {"OMP_NUM_THREADS": str(threads_per_worker(plan.nproc))}
    loopback = loopback_interface()
    if loopback is not None and plan.mode == "local":
        toward = interface_toward(os.environ.get(LIGHTHOUSE_ENV, ""))
        defaults["GLOO_SOCKET_IFNAME"] = toward or loopback
    if plan.mode == "dynamic":
        defaults["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return {k: v for k, v in defaults.items() if k not in os.environ}
