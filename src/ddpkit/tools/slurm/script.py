"""``ddpkit slurm``: a correct sbatch script for a ddpkit job.

One task per node runs ``ddpkit run``, which reads the node count, this node's index and the
master (the first host of the node list) from SLURM and starts one worker per GPU. It fixes
the tutorials' template: ``#SBATCH --nodes=$1`` is never expanded (sbatch directives are not
shell), ``--gres=gpu:1`` gave each node one GPU while the job expected several, ``--mem`` is
per node (not per GPU), one CPU per task starves the data loaders, and the master address
and node rank were left to hand-set variables.

With ``requeue=True`` the job survives preemption and its time limit: SLURM sends SIGUSR1 two
minutes before the limit, every worker checkpoints and exits 75, and the script requeues the
job, which resumes from that checkpoint when it starts again.

Example:
    >>> text = sbatch_script(SbatchOptions(nodes=2, gpus_per_node=4), "train.py", [])
    >>> print(text)  # doctest: +ELLIPSIS
    #!/bin/bash
    ...
    #SBATCH --nodes=2
    #SBATCH --ntasks-per-node=1
    ...
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ddpkit.errors import ConfigError


@dataclass(frozen=True)
class SbatchOptions:
    """What the job asks SLURM for.

    Example:
        >>> SbatchOptions(nodes=1).workers_per_node
        1
    """

    nodes: int = 1
    gpus_per_node: int = 0
    nproc_per_node: int | None = None
    cpus_per_task: int | None = None
    time: str | None = None
    partition: str | None = None
    mem: str | None = None
    job_name: str = "ddpkit"
    requeue: bool = False
    warn_seconds: int = 120  # with requeue: SIGUSR1 this long before the time limit

    @property
    def workers_per_node(self) -> int:
        """One worker per GPU, or as asked (CPU jobs)."""
        return self.nproc_per_node or self.gpus_per_node or 1

    @property
    def cpus(self) -> int:
        """Cores for the node's one task: as asked, or 4 per worker for it and its loaders."""
        return self.cpus_per_task or 4 * self.workers_per_node


def sbatch_script(options: SbatchOptions, script: str, script_args: list[str]) -> str:
    """The text of an sbatch script that runs ``script`` with ddpkit on every node.

    Example:
        >>> "srun ddpkit run --nproc 1 train.py" in sbatch_script(SbatchOptions(), "train.py", [])
        True
    """
    _check(options)
    workers = options.workers_per_node
    cpus = options.cpus
    lines = [
        "#!/bin/bash",
        "# One task per node runs `ddpkit run`, which starts one worker per GPU and reads the",
        "# node count, node rank and master address (the first node) from SLURM.",
        f"# --cpus-per-task: all cores for the node's {workers} worker(s) and their data loaders.",
        f"#SBATCH --job-name={options.job_name}",
        f"#SBATCH --nodes={options.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={cpus}",
    ]
    if options.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={options.gpus_per_node}")
    lines += _optional_directives(options)
    lines += ["#SBATCH --output=%x-%j.out", "", "set -euo pipefail", "", *_SRUN_CPUS]
    command = shlex.join(["srun", "ddpkit", "run", "--nproc", str(workers), script, *script_args])
    lines += _requeue_on_75(command) if options.requeue else [command]
    return "\n".join(lines) + "\n"


# srun of SLURM 22.05 to 23.02 does not pass the job's --cpus-per-task on to the step, which
# left `ddpkit run` and all its workers on one core where task binding is on.
_SRUN_CPUS = [
    "# srun 22.05-23.02 does not pass --cpus-per-task on to the step by itself",
    'export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"',
    "",
]


def _requeue_on_75(command: str) -> list[str]:
    return [
        "code=0",
        f"{command} || code=$?",
        "# 75: the workers were asked to stop (time limit, preemption) and checkpointed; the",
        "# requeued job resumes from the checkpoint. Pass --checkpoint-dir to your script.",
        'if [ "$code" -eq 75 ]; then scontrol requeue "$SLURM_JOB_ID"; fi',
        'exit "$code"',
    ]


def _optional_directives(options: SbatchOptions) -> list[str]:
    directives = []
    if options.time:
        directives.append(f"#SBATCH --time={options.time}")
    if options.partition:
        directives.append(f"#SBATCH --partition={options.partition}")
    if options.mem:
        directives.append(f"#SBATCH --mem={options.mem}")  # per node, not per GPU
    if options.requeue:
        directives += [
            "#SBATCH --requeue",
            f"#SBATCH --signal=USR1@{options.warn_seconds}",  # to every task, before the limit
            "#SBATCH --open-mode=append",  # a requeued run adds to the same output file
        ]
    return directives


def _check(options: SbatchOptions) -> None:
    if options.nodes < 1:
        raise ConfigError(f"--nodes must be >= 1 (got {options.nodes})")
    if options.gpus_per_node < 0:
        raise ConfigError(f"--gpus-per-node must be >= 0 (got {options.gpus_per_node})")
    if options.nproc_per_node is not None and options.nproc_per_node < 1:
        raise ConfigError(f"--nproc-per-node must be >= 1 (got {options.nproc_per_node})")
    if options.gpus_per_node and options.workers_per_node > options.gpus_per_node:
        raise ConfigError(
            f"--nproc-per-node {options.workers_per_node} exceeds --gpus-per-node "
            f"{options.gpus_per_node}: each worker needs its own GPU"
        )
