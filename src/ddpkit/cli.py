"""The ``ddpkit`` command: ``ddpkit run`` launches, ``ddpkit slurm`` writes an sbatch script.

Mistakes in the command line end in one line naming what was wrong and how to fix it (exit
code 2); a failed worker ends the launcher with that worker's exit code.

Example:
    $ ddpkit run --nproc 2 examples/wine.py --epochs 20
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence

from ddpkit import __version__
from ddpkit.errors import DdpkitError, WorkerFailedError
from ddpkit.launch import run_script
from ddpkit.plan import LaunchPlan, plan_from_slurm
from ddpkit.slurm import SbatchOptions, sbatch_script
from ddpkit.world import slurm_nodes


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand.

    Example:
        >>> args = build_parser().parse_args(["run", "--nproc", "2", "train.py", "--lr", "0.1"])
        >>> args.script_args
        ['--lr', '0.1']
    """
    parser = argparse.ArgumentParser(
        prog="ddpkit", description="Distributed data-parallel training for PyTorch."
    )
    parser.add_argument("--version", action="version", version=f"ddpkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="launch a training script on N worker processes (torchrun semantics)",
        description="Launch SCRIPT as N worker processes on this node through torch's elastic "
        "launcher. Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, "
        "MASTER_ADDR and MASTER_PORT, so torchrun-style scripts run unchanged.",
    )
    run.add_argument(
        "--nproc",
        "--nproc-per-node",
        type=int,
        default=1,
        metavar="N",
        help="worker processes on this node (default: 1; one per GPU is usual)",
    )
    run.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="K",
        help="restart the whole worker group up to K times after a failure",
    )
    nodes = run.add_argument_group("several nodes (run the same command on each)")
    nodes.add_argument(
        "--nnodes",
        default=None,
        metavar="N|MIN:MAX",
        help="number of nodes; MIN:MAX for an elastic job (default: 1)",
    )
    nodes.add_argument(
        "--node-rank",
        type=int,
        default=None,
        metavar="R",
        help="this node's index, 0 on the master's node (static, with --master)",
    )
    nodes.add_argument(
        "--master",
        default=None,
        metavar="ADDR:PORT",
        help="node 0's address and a free port there (static rendezvous)",
    )
    nodes.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="where nodes meet (dynamic rendezvous; node ranks are assigned)",
    )
    nodes.add_argument(
        "--rdzv-id",
        default=None,
        metavar="ID",
        help="a job id shared by all nodes of one dynamic job",
    )
    nodes.add_argument(
        "--local-addr",
        default=None,
        metavar="ADDR",
        help="this node's address as the others reach it (default: its FQDN)",
    )
    run.add_argument("script", help="the training script (a .py file)")
    run.add_argument(
        "script_args", nargs=argparse.REMAINDER, help="arguments passed to the script unchanged"
    )
    _add_slurm_command(commands)
    return parser


def _add_slurm_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    slurm = commands.add_parser(
        "slurm",
        help="print an sbatch script that runs SCRIPT with ddpkit on SLURM",
        description="Print an sbatch script: one task per node runs `ddpkit run`, which "
        "reads the nodes and the master from SLURM. Save it and submit with sbatch.",
    )
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
    slurm.add_argument("script", help="the training script")
    slurm.add_argument("script_args", nargs=argparse.REMAINDER, help="passed to the script")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ddpkit`` console script; returns the process exit code.

    Example:
        >>> main(["run", "--nproc", "0", "train.py"])  # doctest: +SKIP
        2
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except WorkerFailedError as err:
        print(f"ddpkit {args.command}: {err}", file=sys.stderr)
        return _exit_code(err.exitcode)
    except DdpkitError as err:
        print(f"ddpkit {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ddpkit {args.command}: interrupted; workers stopped", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    if args.command == "slurm":
        print(sbatch_script(_sbatch_options(args), args.script, args.script_args), end="")
        return 0
    run_script(launch_plan(args), args.script, args.script_args)
    return 0


def _sbatch_options(args: argparse.Namespace) -> SbatchOptions:
    names = ("nodes", "gpus_per_node", "nproc_per_node", "cpus_per_task", "time", "partition")
    return SbatchOptions(
        **{name: getattr(args, name) for name in names}, mem=args.mem, job_name=args.job_name
    )


def launch_plan(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> LaunchPlan:
    """The plan the ``run`` flags ask for; inside a SLURM step, nodes come from SLURM.

    Example:
        >>> args = build_parser().parse_args(["run", "--nproc", "2", "train.py"])
        >>> launch_plan(args, environ={}).mode
        'local'
    """
    flags = {"nnodes": args.nnodes, "master": args.master, "rdzv_endpoint": args.rdzv_endpoint}
    plan = LaunchPlan(
        nproc=args.nproc,
        nnodes=args.nnodes or "1",
        node_rank=args.node_rank,
        master=args.master,
        rdzv_endpoint=args.rdzv_endpoint,
        max_restarts=args.max_restarts,
        local_addr=args.local_addr,
        rdzv_id=args.rdzv_id,
    )
    job = slurm_nodes(environ)
    if job is not None and not any(flags.values()):  # `srun ddpkit run train.py`
        plan = plan_from_slurm(plan, job)
    return plan


def _exit_code(worker_exitcode: int) -> int:
    # A worker killed by signal N reports -N; shells report that as 128 + N.
    return 128 - worker_exitcode if worker_exitcode < 0 else (worker_exitcode or 1)


if __name__ == "__main__":
    sys.exit(main())
