"""``ddpkit slurm``: a correct sbatch script for a ddpkit job.

One task per node runs ``ddpkit run``, which reads the node count, this node's index and the
master (the first host of the node list) from SLURM and starts one worker per GPU. It fixes
the tutorials' template: ``#SBATCH --nodes=$1`` is never expanded (sbatch directives are not
shell), ``--gres=gpu:1`` gave each node one GPU while the job expected several, ``--mem`` is
per node (not per GPU), one CPU per task starves the data loaders, and the master address
and node rank were left to hand-set variables.

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

    @property
    def workers_per_node(self) -> int:
        """One worker per GPU, or as asked (CPU jobs)."""
        return self.nproc_per_node or self.gpus_per_node or 1


def sbatch_script(options: SbatchOptions, script: str, script_args: list[str]) -> str:
    """The text of an sbatch script that runs ``script`` with ddpkit on every node.

    Example:
        >>> "srun ddpkit run --nproc 1 train.py" in sbatch_script(SbatchOptions(), "train.py", [])
        True
    """
    _check(options)
    workers = options.workers_per_node
    cpus = options.cpus_per_task or 4 * workers
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
    lines += ["#SBATCH --output=%x-%j.out", "", "set -euo pipefail", ""]
    command = ["srun", "ddpkit", "run", "--nproc", str(workers), script, *script_args]
    lines.append(shlex.join(command))
    return "\n".join(lines) + "\n"


def _optional_directives(options: SbatchOptions) -> list[str]:
    directives = []
    if options.time:
        directives.append(f"#SBATCH --time={options.time}")
    if options.partition:
        directives.append(f"#SBATCH --partition={options.partition}")
    if options.mem:
        directives.append(f"#SBATCH --mem={options.mem}")  # per node, not per GPU
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
