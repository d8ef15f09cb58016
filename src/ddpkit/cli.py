"""The ``ddpkit`` command: ``ddpkit run --nproc N script.py [script args]``.

Mistakes in the command line end in one line naming what was wrong and how to fix it (exit
code 2); a failed worker ends the launcher with that worker's exit code.

Example:
    $ ddpkit run --nproc 2 examples/wine.py --epochs 20
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ddpkit import __version__
from ddpkit.errors import ConfigError, DdpkitError, WorkerFailedError
from ddpkit.launch import run_script


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
    run.add_argument("script", help="the training script (a .py file)")
    run.add_argument(
        "script_args", nargs=argparse.REMAINDER, help="arguments passed to the script unchanged"
    )
    return parser


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
    if args.max_restarts < 0:
        raise ConfigError(f"--max-restarts must be >= 0 (got {args.max_restarts})")
    run_script(args.nproc, args.script, args.script_args, max_restarts=args.max_restarts)
    return 0


def _exit_code(worker_exitcode: int) -> int:
    # A worker killed by signal N reports -N; shells report that as 128 + N.
    return 128 - worker_exitcode if worker_exitcode < 0 else (worker_exitcode or 1)


if __name__ == "__main__":
    sys.exit(main())
