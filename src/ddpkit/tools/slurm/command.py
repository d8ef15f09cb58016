"""``ddpkit slurm``: print an sbatch script that runs SCRIPT with ddpkit on SLURM.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(); add_arguments(parser)
    >>> parser.parse_args(["--nodes", "2", "train.py"]).nodes
    2
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ddpkit._core.log import command_logger
from ddpkit.tools.slurm.fit import check_fits, cluster_node_groups
from ddpkit.tools.slurm.script import SbatchOptions, sbatch_script

HELP = "print an sbatch script that runs SCRIPT with ddpkit on SLURM"
DESCRIPTION = (
    "Print an sbatch script: one task per node runs `ddpkit run`, which reads the nodes and "
    "the master from SLURM. Save it and submit with sbatch."
)


def add_arguments(slurm: argparse.ArgumentParser) -> None:
    """The job's shape, its limits, requeueing, and the script.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> parser.parse_args(["--requeue", "t.py"]).requeue
        True
    """
    slurm.add_argument("--nodes", type=int, default=1)
    slurm.add_argument("--gpus-per-node", type=int, default=0, help="0 for a CPU job")
    slurm.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help="workers per node (default: one per GPU, or 1)",
    )
    slurm.add_argument(
        "--cpus-per-task",
        type=int,
        default=None,
        help="cores per node for all its workers (default: 4 per worker)",
    )
    slurm.add_argument("--time", default=None, help="time limit, like 01:00:00")
    slurm.add_argument("--partition", default=None)
    slurm.add_argument("--mem", default=None, help="memory per node, like 64G")
    slurm.add_argument("--job-name", default="ddpkit")
    slurm.add_argument(
        "--requeue",
        action="store_true",
        help="survive preemption and the time limit: SIGUSR1 120 s before it, checkpoint, "
        "exit 75, requeue, resume (the script needs a --checkpoint-dir)",
    )
    slurm.add_argument(
        "--no-check",
        action="store_true",
        help="do not ask sinfo whether the partition's nodes can hold the job",
    )
    slurm.add_argument("script", help="the training script")
    slurm.add_argument("script_args", nargs=argparse.REMAINDER, help="passed to the script")


def main(args: argparse.Namespace) -> int:
    """Check the flags (and the partition, unless --no-check), then print the script.

    Example::

        main(parser.parse_args(["--nodes", "2", "--gpus-per-node", "4", "train.py"]))
    """
    options = sbatch_options(args)
    text = sbatch_script(options, args.script, args.script_args)  # checks the flags first
    groups = None if args.no_check else cluster_node_groups()
    if groups is not None:
        check_fits(options, groups)
    if not Path(args.script).exists():
        command_logger("slurm").warning(
            f"warning: {args.script} does not exist here; the job runs it from the folder "
            "you call sbatch in"
        )
    print(text, end="")
    return 0


def sbatch_options(args: argparse.Namespace) -> SbatchOptions:
    """The parsed flags as :class:`SbatchOptions`.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> sbatch_options(parser.parse_args(["t.py"])).nodes
        1
    """
    names = ("nodes", "gpus_per_node", "nproc_per_node", "cpus_per_task", "time", "partition")
    return SbatchOptions(
        **{name: getattr(args, name) for name in names},
        mem=args.mem,
        job_name=args.job_name,
        requeue=args.requeue,
    )
