"""The ``ddpkit`` command: ``run`` launches, ``bench`` measures scaling, ``verify`` proves N
workers equal one process, ``doctor`` checks the environment, ``slurm`` writes sbatch.

Mistakes in the command line end in one line naming what was wrong and how to fix it (exit
code 2); a failed worker ends the launcher with that worker's exit code.

Example:
    $ ddpkit run --nproc 2 examples/wine.py --epochs 20
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddpkit import __version__
from ddpkit.env.slurm import slurm_nodes
from ddpkit.errors import DdpkitError, PreemptedError, StoppedBySignalError, WorkerFailedError
from ddpkit.launch.launcher import run_script
from ddpkit.launch.plan import LaunchPlan, plan_from_slurm
from ddpkit.runtime.watchdog import HANG_TIMEOUT_ENV
from ddpkit.tools.bench.report import markdown_table, write_charts, write_results
from ddpkit.tools.bench.runner import BenchConfig, run_bench
from ddpkit.tools.doctor.command import add_doctor_command, run_doctor
from ddpkit.tools.slurm.fit import check_fits, cluster_node_groups
from ddpkit.tools.slurm.script import SbatchOptions, sbatch_script
from ddpkit.tools.verify.runner import add_verify_command, run_verify_command


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
        help="restart the whole worker group up to K times after a failure; with a "
        "checkpoint_dir the workers resume from the newest checkpoint",
    )
    _add_diagnostic_options(run)
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
    _add_bench_command(commands)
    add_doctor_command(commands)
    add_verify_command(commands)
    return parser


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


def worker_settings(args: argparse.Namespace) -> dict[str, str]:
    """The workers' environment that ``run``'s diagnostic flags ask for.

    Example:
        >>> args = build_parser().parse_args(["run", "--hang-timeout", "30", "t.py"])
        >>> worker_settings(args)
        {'DDPKIT_HANG_TIMEOUT': '30.0'}
    """
    settings = {}
    if args.hang_timeout is not None:
        settings[HANG_TIMEOUT_ENV] = str(args.hang_timeout)
    if args.debug_collectives:
        settings["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    return settings


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def _add_bench_options(parser: argparse.ArgumentParser, default: Any) -> None:
    def pick(value: Any) -> Any:
        return value if default is None else default

    parser.add_argument(
        "--workers",
        type=_sizes,
        default=pick((1, 2, 4)),
        metavar="N,N,...",
        help="world sizes to run (default: 1,2,4; 1 is a plain process, the baseline)",
    )
    parser.add_argument("--repeat", type=int, default=pick(1), help="runs per size (median)")
    parser.add_argument("--out", default=pick("bench"), help="output folder (default: bench)")
    parser.add_argument(
        "--threads-per-worker",
        type=int,
        default=pick(None),
        metavar="T",
        help="CPU threads per worker at every size (default: cores / largest size)",
    )


def _add_bench_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    bench = commands.add_parser(
        "bench",
        help="run SCRIPT at 1, 2, 4 workers: scaling table, CSV/JSON and charts",
        description="Run the unchanged SCRIPT at each world size and report training time, "
        "samples/s, speedup, efficiency and loss curves. bench's own options may come before "
        "or after SCRIPT; everything else (and all after --) goes to the script.",
    )
    _add_bench_options(bench, None)
    bench.add_argument("script", help="the training script (reports through ddpkit.Trainer)")
    bench.add_argument("script_args", nargs=argparse.REMAINDER, help="passed to the script")


def parse_bench(argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``bench ...``: its own options may follow SCRIPT; all after ``--`` is the script's.

    Example:
        >>> parse_bench(["bench", "t.py", "--workers", "1,2", "--", "--workers", "8"]).script_args
        ['--workers', '8']
    """
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:cut])
    late = argparse.ArgumentParser(add_help=False)
    _add_bench_options(late, argparse.SUPPRESS)
    found, unknown = late.parse_known_args(args.script_args)
    merged = argparse.Namespace(**{**vars(args), **vars(found)})
    merged.script_args = unknown + argv[cut + 1 :]
    return merged


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list like 1,2,4") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: world sizes must be positive")
    return tuple(sorted(set(sizes)))


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ddpkit`` console script; returns the process exit code.

    Example:
        >>> main(["run", "--nproc", "0", "train.py"])  # doctest: +SKIP
        2
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_bench(argv) if argv[:1] == ["bench"] else build_parser().parse_args(argv)
    try:
        return _run(args)
    except PreemptedError as err:
        print(f"ddpkit {args.command}: workers {err} (exit code {err.exitcode})", file=sys.stderr)
        return err.exitcode
    except StoppedBySignalError as err:
        print(f"ddpkit {args.command}: {err}", file=sys.stderr)
        return err.exitcode
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
    if args.command == "bench":
        return _bench(args)
    if args.command == "doctor":
        return run_doctor(args)
    if args.command == "verify":
        return run_verify_command(args)
    if args.command == "slurm":
        return _slurm(args)
    run_script(launch_plan(args), args.script, args.script_args, worker_settings(args))
    return 0


def _bench(args: argparse.Namespace) -> int:
    config = BenchConfig(
        script=args.script,
        script_args=tuple(args.script_args),
        workers=args.workers,
        repeat=args.repeat,
        out=Path(args.out),
        threads_per_worker=args.threads_per_worker,
    )
    summary = run_bench(config)
    written = write_results(summary, config.out)
    charts = write_charts(summary, config.out)
    print(f"\n{markdown_table(summary['rows'])}\n")
    print(f"batch policy: {summary['rows'][0]['batch_policy']}; "
          f"{summary['threads_per_worker']} thread(s) per worker")  # fmt: skip
    for path in [*written, *(charts if isinstance(charts, list) else [])]:
        print(f"wrote {path}")
    if isinstance(charts, str):
        print(charts)
    return 0


def _slurm(args: argparse.Namespace) -> int:
    options = _sbatch_options(args)
    text = sbatch_script(options, args.script, args.script_args)  # checks the flags first
    groups = None if args.no_check else cluster_node_groups()
    if groups is not None:
        check_fits(options, groups)
    if not Path(args.script).exists():
        print(f"ddpkit slurm: warning: {args.script} does not exist here; the job runs it "
              "from the folder you call sbatch in", file=sys.stderr)  # fmt: skip
    print(text, end="")
    return 0


def _sbatch_options(args: argparse.Namespace) -> SbatchOptions:
    names = ("nodes", "gpus_per_node", "nproc_per_node", "cpus_per_task", "time", "partition")
    return SbatchOptions(
        **{name: getattr(args, name) for name in names},
        mem=args.mem,
        job_name=args.job_name,
        requeue=args.requeue,
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
