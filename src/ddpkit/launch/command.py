"""``ddpkit run``: launch a training script on N worker processes (torchrun semantics).

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_arguments(parser)
    >>> args = parser.parse_args(["--nproc_per_node=2", "train.py", "--lr", "0.1"])
    >>> args.nproc_per_node, args.training_script_args
    ('2', ['--lr', '0.1'])
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ddpkit._core.protocol import HANG_TIMEOUT_ENV
from ddpkit._core.system import threads_per_worker
from ddpkit.env.kubernetes import detect_pod_job
from ddpkit.env.slurm import slurm_nodes
from ddpkit.errors import ConfigError
from ddpkit.launch.lifeline import stop_at_end_of_input
from ddpkit.launch.profileflags import add_profile_arguments, profile_settings
from ddpkit.launch.program import Program
from ddpkit.launch.quickparse import parse_without_torch
from ddpkit.launch.remote.flags import add_host_arguments, hosts_given, run_hosts
from ddpkit.launch.torchrun_flags import (
    add_torchrun_arguments,
    check_supported,
    log_options,
    parse_rdzv_conf,
    rendezvous_flags,
    resolve_nproc,
)
from ddpkit.launch.warm.choice import choose_workers, warm
from ddpkit.launch.warm.forkserver import start_warm_server

if TYPE_CHECKING:
    from ddpkit.launch.plan import LaunchPlan

# torch's launcher: imported by parse(), not with this module: `ddpkit run --hosts` needs
# none here, and a warm server is on its way first.
LAUNCHER = "ddpkit.launch.launcher"

HELP = "launch a training script on N worker processes (torchrun's command line)"
DESCRIPTION = (
    "Launch SCRIPT as N worker processes on this node through torch's elastic launcher. "
    "Every torchrun flag works with torchrun's meaning (and PET_* variables as defaults); "
    "each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR "
    "and MASTER_PORT, so torchrun scripts and command lines run unchanged."
)


def add_arguments(run: argparse.ArgumentParser) -> None:
    """``run``'s flags: torchrun's, whole (:mod:`ddpkit.launch.torchrun_flags`), and ddpkit's.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> parser.parse_args(["--max_restarts=3", "t.py"]).max_restarts
        3
    """
    add_torchrun_arguments(run)
    add_own_arguments(run)


def add_own_arguments(run: argparse.ArgumentParser) -> None:
    """``run``'s flags that are ddpkit's, not torchrun's (no torch needed to add them).

    Example:
        >>> parser = argparse.ArgumentParser(); add_own_arguments(parser)
        >>> parser.parse_args(["--hosts", "a,b", "--hang-timeout", "30"]).hang_timeout
        30.0
    """
    ours = run.add_argument_group("ddpkit's own")
    ours.add_argument(
        "--nproc",
        dest="nproc_per_node",
        default=argparse.SUPPRESS,  # torchrun's --nproc-per-node holds the default
        metavar="N",
        help="worker processes on this node: --nproc-per-node's short name",
    )
    ours.add_argument(
        "--master",
        default=None,
        metavar="ADDR:PORT",
        help="node 0's address and a free port there (static rendezvous): --master-addr "
        "and --master-port in one",
    )
    ours.add_argument(
        "--hang-timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="seconds one training step or collective may take; past it every rank reports "
        "what it is doing and the job exits with code 124 (default 600; 0: off)",
    )
    ours.add_argument(
        "--no-merge-output",
        dest="merge_output",
        action="store_false",
        help="print each worker's lines as they come, unprefixed, instead of merging the "
        "lines several ranks print alike into one '[ranks 0-3] ...' line",
    )
    ours.add_argument(
        "--fresh-workers",
        action="store_true",
        help="start each worker as a fresh python, as torchrun does, instead of forking it "
        "from this launch's warm server (which imported torch once: the default)",
    )
    ours.add_argument(
        "--no-memory-snapshots",
        dest="memory_snapshots",
        action="store_false",
        help="with --max-restarts: do not keep each step's state in this node's memory "
        "(/dev/shm); a restarted worker then resumes from the checkpoint folder",
    )
    ours.add_argument(
        "--merge-window",
        type=_seconds,
        default=0.5,
        metavar="S",
        help="how long a line waits for the same line from other ranks (default 0.5 s)",
    )
    ours.add_argument(
        "--debug-collectives",
        action="store_true",
        help="check before each collective that all ranks call the same one with the same "
        "shapes (TORCH_DISTRIBUTED_DEBUG=DETAIL; slower, for debugging)",
    )
    add_profile_arguments(run)
    add_host_arguments(run)


def parse_quickly(argv: Sequence[str]) -> argparse.Namespace | None:
    """``run``'s command line parsed without torch's parser where ddpkit can read it alone
    (``--hosts``: this machine runs no worker, :mod:`ddpkit.launch.quickparse`); else None.
    The warm server (the default, :mod:`ddpkit.launch.warm.choice`) is started here, so that
    it imports torch while torch's parser does: on two cores the launcher's import is then free.

    Example:
        >>> parse_quickly(["--nproc", "2", "train.py"]) is None  # a launch here: torch's parser
        True
    """
    own = argparse.ArgumentParser(prog="ddpkit run", add_help=False, allow_abbrev=False)
    add_own_arguments(own)
    args = parse_without_torch(argv, own)
    if args is not None and hosts_given(args):
        args.argv = list(argv)
        return args
    if args is None:
        return None
    choose_workers(args)
    if warm(args) and str(args.nproc_per_node).isdigit():
        start_warm_server({**_threads(args), **worker_settings(args)})  # gpu/auto: torch's
    return None


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``run``'s command line parsed; then torch's launcher imported (the seconds in which
    ``ddpkit``'s entry point only notes a stop signal). Warm workers' server (the default)
    starts first, importing torch._dynamo and ddpkit while the launcher's modules load;
    ``--hosts`` imports no launcher here.

    Example::

        args = parse(parser, ["--nproc", "2", "train.py"])
    """
    args = parser.parse_args(argv)
    args.argv = list(argv)  # --hosts passes it on to every host
    choose_workers(args)
    # started already, unless the command line needed torch's parser; --hosts runs no worker
    if warm(args) and not hosts_given(args):
        # spawn where no server can start (a long TMPDIR: said once, with the fix)
        args.start_method = start_warm_server({**_threads(args), **worker_settings(args)})
    if not hosts_given(args):  # --hosts starts ddpkit run on each host: no torch here
        importlib.import_module(LAUNCHER)
    return args


def _threads(args: argparse.Namespace) -> dict[str, str]:
    """The workers' OMP_NUM_THREADS default (the launcher's own rule), for the warm server."""
    try:
        return {"OMP_NUM_THREADS": str(threads_per_worker(resolve_nproc(args.nproc_per_node)))}
    except ConfigError:  # said by the launcher, with the fix, once it runs
        return {}


def main(args: argparse.Namespace) -> int:
    """Run the script as the flags ask; 0 when every worker succeeded.

    Example::

        main(parser.parse_args(["--nproc", "2", "examples/wine.py"]))
    """
    if hosts_given(args):  # each host's ddpkit run checks the whole command line itself
        return run_hosts(args, getattr(args, "argv", []))
    check_supported(args)
    choose_workers(args)
    stop_at_end_of_input()  # started by --hosts over ssh: its connection is its lifeline
    program = Program(args.training_script, tuple(args.training_script_args),
                      module=args.module, no_python=args.no_python,
                      run_path=args.run_path)  # fmt: skip
    launcher = importlib.import_module(LAUNCHER)
    launcher.run_script(launch_plan(args), program, worker_settings(args))
    return 0


def worker_settings(args: argparse.Namespace) -> dict[str, str]:
    """The workers' environment that ``run``'s diagnostic flags ask for.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> worker_settings(parser.parse_args(["--hang-timeout", "30", "t.py"])) == {
        ...     HANG_TIMEOUT_ENV: "30.0"}
        True
    """
    settings = profile_settings(args)
    if args.hang_timeout is not None:
        settings[HANG_TIMEOUT_ENV] = str(args.hang_timeout)
    if args.debug_collectives:
        settings["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    return settings


def launch_plan(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> LaunchPlan:
    """The plan the ``run`` flags ask for; inside a SLURM step, nodes come from SLURM, and in
    a Kubernetes training pod from its controller (:mod:`ddpkit.env.kubernetes`).

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> launch_plan(parser.parse_args(["--nproc", "2", "train.py"]), environ={}).mode
        'local'
    """
    from ddpkit.launch.plan import LaunchPlan, plan_from_pod, plan_from_slurm

    choose_workers(args)
    env = os.environ if environ is None else environ
    pod = detect_pod_job(env)
    from_pod = pod is not None and not _rendezvous_given(args, env)
    rendezvous = {"master": None, "rdzv_endpoint": None} if from_pod else rendezvous_flags(args)
    plan = LaunchPlan(
        nproc=resolve_nproc(args.nproc_per_node),
        nnodes="1" if from_pod else args.nnodes or "1",
        node_rank=None if from_pod else args.node_rank,
        max_restarts=args.max_restarts,
        local_addr=args.local_addr,
        rdzv_id=args.rdzv_id,
        rdzv_conf=parse_rdzv_conf(args.rdzv_conf),
        monitor_interval=float(args.monitor_interval),
        start_method=args.start_method,
        role=args.role,
        merge_output=args.merge_output,
        merge_window=args.merge_window,
        memory_snapshots=args.memory_snapshots,
        **rendezvous,
        **log_options(args),
    )
    if pod is not None and from_pod:
        nnodes = _given(args.nnodes, env.get("PET_NNODES", "1:1"))  # torchrun's default: 1:1
        return plan_from_pod(plan, pod, nnodes)
    given = (args.nnodes not in (None, "1", "1:1"), *rendezvous.values(), args.standalone)
    job = slurm_nodes(environ)
    if job is not None and not any(given):  # `srun ddpkit run train.py`
        plan = plan_from_slurm(plan, job)
    return plan


def _rendezvous_given(args: argparse.Namespace, env: Mapping[str, str]) -> bool:
    """Whether the command line names where nodes meet (beyond the pod's PET_* defaults)."""
    return bool(
        args.standalone
        or getattr(args, "master", None)
        or _given(args.master_addr, env.get("PET_MASTER_ADDR"))
        or _given(args.rdzv_endpoint or None, env.get("PET_RDZV_ENDPOINT"))
    )


def _given(value: str | None, from_environment: str | None) -> str | None:
    return None if value is None or value == from_environment else value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value
