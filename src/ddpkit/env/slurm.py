"""What SLURM tells a job's processes, read for ``World`` and for ``srun ddpkit run``.

SLURM describes a job step through ``SLURM_*`` variables: ``SLURM_PROCID`` / ``SLURM_NTASKS``
(a task's rank and the step's task count), ``SLURM_LOCALID`` / ``SLURM_NODEID`` (its place on
and among the nodes), ``SLURM_JOB_NODELIST`` (where rank 0 runs). The job's batch script sees
most of them too, with ``SLURM_PROCID=0``, but it is not a task: only ``srun`` starts the
tasks, and a batch script that trained as if it were rank 0 of ``SLURM_NTASKS`` would wait for
peers nobody started. ``SLURM_STEP_ID`` tells the two apart; it is set in srun's tasks only.

Example:
    >>> env = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"}
    >>> in_step(env), slurm_port(env)
    (True, 20007)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ddpkit._core.envvars import int_var
from ddpkit.env.hostlist import expand_hostlist
from ddpkit.errors import ConfigError


def in_step(env: Mapping[str, str]) -> bool:
    """Whether this process is one of an ``srun`` step's tasks (not a batch script or salloc).

    Example:
        >>> in_step({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"})
        False
    """
    return "SLURM_STEP_ID" in env or "SLURM_STEPID" in env


def check_started_by_srun(env: Mapping[str, str]) -> None:
    """Refuse a batch script posing as rank 0 of a job of several tasks.

    Before this check, ``python train.py`` in an ``#SBATCH --ntasks=2`` script waited for a
    rank 1 that nothing starts, silently, until the job's time limit.

    Example:
        >>> check_started_by_srun({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    """
    ntasks = int_var(env, "SLURM_NTASKS", default=1)
    if ntasks > 1 and not in_step(env):
        raise ConfigError(
            f"SLURM_NTASKS={ntasks} but this process is job {env.get('SLURM_JOB_ID', '?')}'s "
            f"batch script, not one of its {ntasks} tasks: nothing starts {_others(ntasks)}, so "
            "rank 0 would wait for them until the time limit. Start one task per worker "
            "with `srun python train.py`, or one per node with `srun ddpkit run --nproc N "
            "train.py` and #SBATCH --ntasks-per-node=1 (`ddpkit slurm` writes that script)."
        )


def _others(ntasks: int) -> str:
    return "rank 1" if ntasks == 2 else f"ranks 1..{ntasks - 1}"


def slurm_first_host(env: Mapping[str, str]) -> str | None:
    """The first host of the job's node list: where rank 0 runs.

    Example:
        >>> slurm_first_host({"SLURM_JOB_NODELIST": "gpu[03-04]"})
        'gpu03'
    """
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    return expand_hostlist(nodelist)[0] if nodelist else None


def slurm_port(env: Mapping[str, str]) -> int:
    """A rendezvous port every task of the job derives alike: 20000 + job id % 10000.

    Below Linux's ephemeral range (32768+), so the OS does not hand it out to clients.

    Example:
        >>> slurm_port({"SLURM_JOB_ID": "123456"})
        23456
    """
    job_id = int_var(env, "SLURM_JOB_ID", default=0)
    return 20000 + job_id % 10000


def slurm_tasks_on_node(env: Mapping[str, str], node: int) -> int:
    """Tasks on node ``node``, from SLURM's ``2(x3),1`` per-node task counts.

    Example:
        >>> slurm_tasks_on_node({"SLURM_STEP_TASKS_PER_NODE": "2(x2),1"}, 2)
        1
    """
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not spec:
        return int_var(env, "SLURM_NTASKS_PER_NODE", default=int_var(env, "SLURM_NTASKS"))
    counts: list[int] = []
    for part in spec.split(","):
        count, _, repeat = part.partition("(x")
        try:
            counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
        except ValueError:
            raise ConfigError(f"SLURM_TASKS_PER_NODE={spec!r} is not like '2(x3),1'") from None
    if not 0 <= node < len(counts):
        raise ConfigError(f"SLURM_NODEID={node} but tasks are listed for {len(counts)} node(s)")
    return counts[node]


@dataclass(frozen=True)
class SlurmNodes:
    """A SLURM job seen per node, for ``srun ddpkit run`` (one task per node).

    Example:
        >>> job = SlurmNodes(nnodes=2, node_rank=1, ntasks=2, master_addr="n1", master_port=21234)
        >>> job.nnodes
        2
    """

    nnodes: int
    node_rank: int
    ntasks: int
    master_addr: str
    master_port: int


def slurm_nodes(environ: Mapping[str, str] | None = None) -> SlurmNodes | None:
    """The SLURM step this process runs in, or None outside one.

    A one-node job's batch script counts as outside: ``ddpkit run`` there simply runs on the
    node it was given. A batch script of several nodes is refused, since it runs on the first.

    Example:
        >>> slurm_nodes({}) is None
        True
    """
    env = os.environ if environ is None else environ
    if "SLURM_PROCID" not in env or "SLURM_JOB_ID" not in env:
        return None
    nnodes = int_var(env, "SLURM_NNODES", default=int_var(env, "SLURM_JOB_NUM_NODES", default=1))
    if not in_step(env):
        _check_batch_on_one_node(env, nnodes)
        return None
    return SlurmNodes(
        nnodes=nnodes,
        node_rank=int_var(env, "SLURM_NODEID", default=0),
        ntasks=int_var(env, "SLURM_NTASKS", default=nnodes),
        master_addr=env.get("MASTER_ADDR") or slurm_first_host(env) or "127.0.0.1",
        master_port=int_var(env, "MASTER_PORT", default=slurm_port(env)),
    )


def _check_batch_on_one_node(env: Mapping[str, str], nnodes: int) -> None:
    if nnodes > 1:
        raise ConfigError(
            f"`ddpkit run` is running in job {env.get('SLURM_JOB_ID', '?')}'s batch script, "
            f"which runs on the first of its {nnodes} nodes only: the other nodes would never "
            "join. Start it on every node with `srun ddpkit run --nproc N train.py` and "
            "#SBATCH --ntasks-per-node=1 (`ddpkit slurm` writes that script)."
        )
