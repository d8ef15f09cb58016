"""``ddpkit run``: launch a training script on N worker processes (torchrun semantics).

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_arguments(parser)
    >>> args = parser.parse_args(["--nproc", "2", "train.py", "--lr", "0.1"])
    >>> args.nproc, args.script_args
    (2, ['--lr', '0.1'])
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from ddpkit._core.protocol import HANG_TIMEOUT_ENV
from ddpkit.env.slurm import slurm_nodes
from ddpkit.launch.launcher import run_script
from ddpkit.launch.plan import LaunchPlan, plan_from_slurm

HELP = "launch a training script on N worker processes (torchrun semantics)"
DESCRIPTION = (
    "Launch SCRIPT as N worker processes on this node through torch's elastic launcher. "
    "Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and "
    "MASTER_PORT, so torchrun-style scripts run unchanged."
)


def add_arguments(run: argparse.ArgumentParser) -> None:
    """``run``'s flags: workers, restarts, diagnostics, several nodes, the script.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> parser.parse_args(["--max-restarts", "3", "t.py"]).max_restarts
        3
    """
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
        help="restart the whole worker group up to K times after a failure; with a "
        "checkpoint_dir the workers resume from the newest checkpoint",
    )
    _add_diagnostic_options(run)
    _add_node_options(run)
    run.add_argument("script", help="the training script (a .py file)")
    run.add_argument(
        "script_args", nargs=argparse.REMAINDER, help="arguments passed to the script unchanged"
    )


def _add_diagnostic_options(run: argparse.ArgumentParser) -> None:
    group = run.add_argument_group("hangs and mismatched collectives")
    group.add_argument(
        "--hang-timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="seconds one training step or collective may take; past it every rank reports "
        "what it is doing and the job exits with code 124 (default 600; 0: off)",
    )
    group.add_argument(
        "--debug-collectives",
        action="store_true",
        help="check before each collective that all ranks call the same one with the same "
        "shapes (TORCH_DISTRIBUTED_DEBUG=DETAIL; slower, for debugging)",
    )


def _add_node_options(run: argparse.ArgumentParser) -> None:
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


def main(args: argparse.Namespace) -> int:
    """Run the script as the flags ask; 0 when every worker succeeded.

    Example::

        main(parser.parse_args(["--nproc", "2", "examples/wine.py"]))
    """
    run_script(launch_plan(args), args.script, args.script_args, worker_settings(args))
    return 0


def worker_settings(args: argparse.Namespace) -> dict[str, str]:
    """The workers' environment that ``run``'s diagnostic flags ask for.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> worker_settings(parser.parse_args(["--hang-timeout", "30", "t.py"]))
        {'DDPKIT_HANG_TIMEOUT': '30.0'}
    """
    settings = {}
    if args.hang_timeout is not None:
        settings[HANG_TIMEOUT_ENV] = str(args.hang_timeout)
    if args.debug_collectives:
        settings["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    return settings


def launch_plan(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> LaunchPlan:
    """The plan the ``run`` flags ask for; inside a SLURM step, nodes come from SLURM.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> launch_plan(parser.parse_args(["--nproc", "2", "train.py"]), environ={}).mode
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


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value
