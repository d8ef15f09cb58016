"""The ``ddpkit`` command: ``run`` launches, ``bench`` measures scaling, ``verify`` proves N
workers equal one process, ``plan`` dry-runs a world size you do not have, ``doctor`` checks
the environment, ``slurm`` writes sbatch,
``export`` writes a checkpoint's weights to one file.

Every command lives in a module of its own with the same three names: ``add_arguments(parser)``,
``main(args) -> int`` and, where a command's options may follow its SCRIPT,
``parse(parser, argv)``; ``HELP`` and ``DESCRIPTION`` say what it does. A command whose
full parser is costly may read some command lines without it (``parse_quickly(argv)``,
None otherwise: ``ddpkit run --hosts`` needs no torch on the machine that starts it). Only
the module of the command being run is imported, so ``ddpkit run`` pays for the launcher
alone. Mistakes in the
command line end in one line naming what was wrong and how to fix it (exit code 2); a failed
worker ends the launcher with that worker's exit code.

Example:
    >>> args = build_parser().parse_args(["run", "--nproc", "2", "train.py", "--lr", "0.1"])
    >>> args.training_script_args
    ['--lr', '0.1']
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from ddpkit import __version__
from ddpkit._compat.python import exit_without_teardown
from ddpkit._core.interpreter import collector_paused
from ddpkit._core.log import command_logger
from ddpkit._core.protocol import CONFIG_EXIT_CODE, PEER_LOST_EXIT_CODE, STOP_SIGNALS
from ddpkit.errors import (
    DdpkitError,
    PreemptedError,
    RendezvousError,
    ScriptError,
    StoppedBySignalError,
    WorkerFailedError,
)

COMMANDS = {
    "run": "ddpkit.launch.command",
    "bench": "ddpkit.tools.bench.command",
    "verify": "ddpkit.tools.verify.command",
    "plan": "ddpkit.tools.plan.command",
    "doctor": "ddpkit.tools.doctor.command",
    "slurm": "ddpkit.tools.slurm.command",
    "k8s": "ddpkit.tools.k8s.command",
    "export": "ddpkit.tools.export.command",
    "lighthouse": "ddpkit.tools.lighthouse.command",
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (for ``ddpkit --help``; imports every command module).

    Example:
        >>> build_parser().parse_args(["run", "train.py"]).nproc_per_node
        '1'
    """
    parser = argparse.ArgumentParser(
        prog="ddpkit", description="Distributed data-parallel training for PyTorch."
    )
    parser.add_argument("--version", action="version", version=f"ddpkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = command_module(name)
        sub = commands.add_parser(name, help=module.HELP, description=module.DESCRIPTION)
        module.add_arguments(sub)
    return parser


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of one command, as ``ddpkit NAME`` (its errors read ``ddpkit NAME: ...``).

    Example:
        >>> command_parser("run").parse_args(["--nproc", "2", "t.py"]).nproc_per_node
        '2'
    """
    module = command_module(name)
    parser = argparse.ArgumentParser(prog=f"ddpkit {name}", description=module.DESCRIPTION)
    module.add_arguments(parser)
    return parser


def command_module(name: str) -> ModuleType:
    """The module implementing command ``name``.

    Example:
        >>> command_module("slurm").__name__
        'ddpkit.tools.slurm.command'
    """
    return importlib.import_module(COMMANDS[name])


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` parsed by its command's own parser (only that command's module is imported).

    Example:
        >>> parse(["bench", "t.py", "--repeat", "3"]).repeat
        3
    """
    if not argv or argv[0] not in COMMANDS:
        return build_parser().parse_args(argv)  # --help, --version, or a usage error
    name, module = argv[0], command_module(argv[0])
    quick = getattr(module, "parse_quickly", None)  # a command line read without the parser
    args = quick(argv[1:]) if quick else None
    if args is None:
        parser = command_parser(name)
        parse_own = getattr(module, "parse", None)  # a command whose options may follow SCRIPT
        args = parse_own(parser, argv[1:]) if parse_own else parser.parse_args(argv[1:])
    args.command = name
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ddpkit`` console script; returns the process exit code.

    Example:
        >>> main(["slurm", "--nodes", "0", "train.py"])
        2
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    starting = argv[:1] == ["run"]
    if starting:  # a stop while it imports torch is only noted: nothing may be raised there
        _catch_stops_before_launch(raising=False)
    try:
        with collector_paused():  # torch's import makes no garbage (ddpkit._core.interpreter)
            args = parse(argv)  # `run` imports torch here: seconds in which a SIGTERM may come
        if _stops_before_launch:
            raise _StopBeforeLaunch(_stops_before_launch[0])
        if starting:  # Python code only, until torch's agent takes the signals over
            _catch_stops_before_launch(raising=True)
        return _run(args, command_module(args.command))
    except _StopBeforeLaunch as stop:
        said = f"stopped by {stop} before they started; run the same command again"
        return _preempted(command_logger(argv[0]), PreemptedError(said))


def run() -> NoReturn:
    """The ``ddpkit`` console script and ``python -m ddpkit``: :func:`main`, then the
    process ends without the interpreter's teardown, which takes 0.3-0.4 s once torch is
    loaded while the job is already over (:mod:`ddpkit._core.interpreter`).

    Example::

        run()   # reads sys.argv; never returns
    """
    exit_without_teardown(main())


class _StopBeforeLaunch(BaseException):
    """A stop signal while ``ddpkit run`` starts (a BaseException: code it interrupts may
    catch every Exception)."""


_stops_before_launch: list[str] = []  # the stop signals that came while torch was imported


def _catch_stops_before_launch(raising: bool) -> None:
    """A job preempted while it starts is requeued like one preempted while it trains (exit
    75). While torch is imported a signal is only noted: raised inside its native code (a
    C++ frame calling back into Python), an exception aborts the process (std::terminate);
    after that it is raised at once. Once the workers run, torch's agent and the training
    loop take these signals over."""

    def stop(signum: int, _frame: object) -> None:
        _stops_before_launch.append(signal.Signals(signum).name)
        if raising:
            raise _StopBeforeLaunch(_stops_before_launch[0])

    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, name), stop)


def _preempted(say: logging.Logger, err: PreemptedError) -> int:
    say.warning(f"workers {err} (exit code {err.exitcode})")
    return err.exitcode


def _run(args: argparse.Namespace, module: ModuleType) -> int:
    say = command_logger(args.command)
    try:
        return int(module.main(args))
    except PreemptedError as err:
        return _preempted(say, err)
    except StoppedBySignalError as err:
        say.warning(str(err))
        return err.exitcode
    except WorkerFailedError as err:
        say.error(str(err))
        return PEER_LOST_EXIT_CODE if err.peer_lost else _exit_code(err.exitcode)
    except RendezvousError as err:  # the nodes could not meet: retriable (docs/kubernetes.md)
        say.error(f"error: {err}")
        return PEER_LOST_EXIT_CODE if err.retriable else CONFIG_EXIT_CODE
    except ScriptError as err:
        say.error(str(err))
        return err.exitcode
    except DdpkitError as err:
        say.error(f"error: {err}")
        return CONFIG_EXIT_CODE
    except KeyboardInterrupt:
        say.warning("interrupted; workers stopped")
        return 130


def _exit_code(worker_exitcode: int) -> int:
    # A worker killed by signal N reports -N; shells report that as 128 + N.
    return 128 - worker_exitcode if worker_exitcode < 0 else (worker_exitcode or 1)


if __name__ == "__main__":
    sys.exit(main())
