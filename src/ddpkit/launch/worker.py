"""The first code of every worker ``ddpkit run`` starts: tie it to the launcher, run the script.

The worker first ties its life to the launcher's (:mod:`ddpkit.launch.lifeline`), then runs the
script as ``python script.py`` would: ``__main__``, ``sys.argv`` and ``sys.path[0]`` are the
script's, and a traceback starts at the script's own frames. The package does not import
this module, so ``python -m ddpkit.launch.worker`` runs it fresh.

    python -m ddpkit.launch.worker train.py --epochs 10      # what each worker runs
    python -m ddpkit.launch.worker -m pkg.train --epochs 10  # ddpkit run -m pkg.train

Example::

    report_script_error(err)   # a script's uncaught error: recorded, printed unless quiet
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import runpy
import shlex
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ddpkit._compat.elastic import function_worker_result_queue
from ddpkit._compat.python import exit_as_python_does, os_exit_replaced
from ddpkit._core.protocol import (
    LAUNCHER_REPORTS_ENV,
    ONE_STREAM_ENV,
    PREEMPTED_EXIT_CODE,
    STOP_SIGNALS,
    WORKER_SETUP_ENV,
    RecordKind,
    error_record,
    write_error_file,
)
from ddpkit._core.torcherrors import summarize_mismatch
from ddpkit._core.tracebacks import fold_traceback, is_hidden, waiting_call
from ddpkit.errors import ConfigError
from ddpkit.flightrecorder.arming import arm_flight_recorder
from ddpkit.flightrecorder.records import recent_collectives
from ddpkit.launch.lifeline import die_with_launcher
from ddpkit.launch.signalrelay import relay_pending, relay_stop_signals_to_group
from ddpkit.launch.warm.forkserver import take_launcher_stdin


def main(argv: list[str] | None = None) -> None:
    """Run ``argv[0]`` as ``__main__`` with the rest as its arguments.

    Example::

        main(["train.py", "--epochs", "3"])
    """
    args = list(sys.argv[1:] if argv is None else argv)
    module = len(args) >= 2 and args[0] == "-m"
    if module:
        args = args[1:]
    if not args:
        sys.exit("usage: python -m ddpkit.launch.worker [-m MODULE | SCRIPT] [ARGS...]")
    die_with_launcher()
    prepare_worker()
    _run_as_main(args, module)


def prepare_worker() -> None:
    """What every worker does before the script, however it was started: one output stream
    under the merged console, torch's Flight Recorder armed, the stop signals taken, the
    commands' setup hook run.

    Example::

        prepare_worker()   # in a worker ddpkit run started, before the script
    """
    join_streams()
    arm_flight_recorder()  # a plain torchrun script's collectives are recorded too
    stop_outside_training()
    run_setup()


class RunPath:
    """``ddpkit run --run-path``: the script run in a worker torch's launcher started from a
    function (``--start-method``: spawn, as torchrun; forkserver: forked from a server that
    imported torch once), as ``python script.py`` would run it.

    A function worker that ends without returning leaves torch's agent waiting for its
    result, so every successful ending returns: ``sys.exit()`` and ``sys.exit(0)`` (torch's
    own ``--run-path`` returns only for 0), and ``os._exit(0)``: on the main thread it
    becomes ``sys.exit(0)`` here (the script's ``finally`` blocks then run); on another
    thread the process ends at once, as asked, after handing torch the result a return
    would have. A failing code ends the process with it, as before.

    Example:
        >>> RunPath(module=False).__name__
        'run_path'
    """

    def __init__(self, module: bool) -> None:
        self.module = module
        self.__name__ = "run_path"  # torch's launcher names the entrypoint by it

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickled in the new worker before torch's wrapper sets the rank's environment:
        # setproctitle finds argv next to the environment the process started with, and not
        # once it has been rewritten. (A fresh worker's never calls it: its /proc/PID/environ
        # stays readable, which setproctitle's set-up would overwrite.)
        self.__dict__.update(state)
        _ready_process_title()

    def __call__(self, *argv: str) -> None:
        with contextlib.suppress(OSError):  # a session of its own, as torch gives a fresh worker:
            os.setsid()  # Ctrl-C at a terminal reaches the launcher, which stops every worker
        relay_stop_signals_to_group()  # torch signals a fresh worker's group, this one alone
        name_this_worker(argv, self.module)
        take_launcher_stdin()
        prepare_worker()
        exit_ = _returning_exit(os._exit, function_worker_result_queue())
        exiting_as_python = True
        try:
            with os_exit_replaced(exit_):
                _run_as_main(list(argv), self.module)
        except _LeftAtOnce:
            exiting_as_python = False  # os._exit(0) skips them in a fresh interpreter too
        except SystemExit as stop:
            if stop.code not in (None, 0):
                raise
        finally:
            if exiting_as_python:
                exit_as_python_does()
        _stopped_once_finished()


def _stopped_once_finished() -> None:
    """A function worker that finished lives on until torch's agent has every rank's result;
    a stop meanwhile (a peer failed) ends it with 0 and leaves its record "finished", as a
    fresh interpreter that had already ended would be."""
    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, name), _leave_finished)


def _leave_finished(_signum: int, _frame: object) -> None:
    relay_pending()  # what the script left running is stopped with it
    os._exit(0)


class _LeftAtOnce(SystemExit):
    """The script called ``os._exit(0)`` on the main thread: a success, without exit handlers."""


def name_this_worker(argv: Sequence[str], module: bool) -> None:
    """Give a function worker the command line a fresh worker shows, and its rank, in ``ps``
    and ``/proc/PID/cmdline``: a fork shows the server's (``from multiprocessing.forkserver
    import main ...``) on every rank, and ``pkill -f train.py`` or a tool that looks for the
    script would find none. Needs setproctitle (a dependency), readied by
    :meth:`RunPath.__setstate__`; else nothing changes.

    Example::

        name_this_worker(["train.py", "--epochs", "3"], module=False)
        # ps: /usr/bin/python3 -u train.py --epochs 3  (ddpkit rank 0)
    """
    if not _title_setter:
        return
    script = ["-m", *argv] if module else list(argv)
    rank = os.environ.get("RANK", "?")
    _title_setter[0](f"{shlex.join([sys.executable, '-u', *script])}  (ddpkit rank {rank})")


_title_setter: list[Callable[[str], None]] = []  # setproctitle's, once it found argv


def _ready_process_title() -> None:
    try:
        from setproctitle import getproctitle, setproctitle
    except ImportError:  # an install without it: a function worker keeps the line it had
        return
    getproctitle()  # it looks for argv at its first call, not at its import
    _title_setter[:] = [setproctitle]


def _returning_exit(real_exit: Any, result_queue: Any) -> Any:
    worker = os.getpid()  # a process the script forks (DataLoader workers) exits for real

    def exit_(code: int) -> None:
        if code == 0 and os.getpid() == worker:
            if threading.current_thread() is threading.main_thread():
                raise _LeftAtOnce(0)  # returned by RunPath: torch's agent gets its result
            if result_queue is not None:  # another thread: the process ends now, as asked,
                result_queue.put(None)  # with the result a return would have given
        real_exit(code)

    return exit_


def join_streams(environ: Mapping[str, str] | None = None) -> None:
    """Under ``ddpkit run``'s merged console (``DDPKIT_ONE_STREAM=1``), write stderr into
    stdout's file: two files lose the order in which the rank wrote to them (a print, then
    the warning or traceback it led to), one file keeps it, whoever writes (Python, C++,
    a child process).

    Example:
        >>> join_streams({})  # not asked for: stderr stays where it is
    """
    if (os.environ if environ is None else environ).get(ONE_STREAM_ENV) == "1":
        sys.stderr.flush()
        os.dup2(sys.stdout.fileno(), sys.stderr.fileno())


def stop_outside_training() -> None:
    """SIGTERM and SIGUSR1 end this worker with exit code 75 wherever they come, so a
    preempted job can be requeued: ddpkit's Trainer takes them over while it trains (and
    checkpoints first); before, after or without it there is nothing of ddpkit's to save.

    Example::

        stop_outside_training()   # first thing in a worker ddpkit run starts
    """
    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, name), _exit_preempted)


def _exit_preempted(signum: int, _frame: object) -> None:
    message = (
        f"stopped by {signal.Signals(signum).name} outside training (start-up, evaluation "
        "or exit), with nothing new saved; run the same command again"
    )
    calls = recent_collectives()  # stopped in a collective a peer broke: which one
    record = error_record(message, message, kind=RecordKind.PREEMPTED, collectives=calls)
    write_error_file(record, keep_existing=True)  # an error the script recorded stays the cause
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # the main thread may be inside a write
            stream.flush()
    relay_pending()  # what the script started is stopped with it, as a fresh worker's is
    os._exit(PREEMPTED_EXIT_CODE)  # at once, as the signal's default would, but with 75


def _run_as_main(args: list[str], module: bool) -> None:
    """``python SCRIPT ARGS`` or ``python -m MODULE ARGS``, in this process."""
    sys.argv = list(args)
    if module:  # as `python -m`: the current folder first, argv[0] the module's file
        sys.path[0] = os.getcwd()
        spec = importlib.util.find_spec(args[0])
        script = spec.origin if spec is not None and spec.origin else args[0]
    else:
        script = args[0]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        if module:
            runpy.run_module(args[0], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        _record_exit(stop)
        raise
    except KeyboardInterrupt:  # Ctrl-C reached the launcher, which says so once for all
        sys.exit(128 + signal.SIGINT)
    except BaseException as err:
        report_script_error(err)
        sys.exit(1)
    record_finished()


def report_script_error(err: BaseException) -> None:
    """Record the script's error for the launcher, with the user's frames; print it too
    unless the launcher prints the blamed rank's traceback once for all ranks.

    Example::

        report_script_error(ValueError("bad batch"))   # error file written, maybe printed
    """
    text = fold_traceback(err)
    mismatch = summarize_mismatch(str(err))  # torch's is one 1,000-character line
    headline = mismatch or text.splitlines()[-1]
    details = f"{mismatch}\n{text}" if mismatch else text
    # A hang report written before this exception is the cause; it stays.
    calls = recent_collectives()  # torch's Flight Recorder: the collectives it was in
    record = error_record(headline, details, call=waiting_call(err), collectives=calls)
    write_error_file(record, keep_existing=True)
    if not os.environ.get(LAUNCHER_REPORTS_ENV):
        print(details, file=sys.stderr, flush=True)


def record_finished() -> None:
    """Record that the script returned (or called ``sys.exit(0)``), before the exit handlers
    tear the process group down: a worker the agent stops meanwhile, because a peer failed,
    is then known to have finished, not blamed (the file is read only if it fails).

    Example:
        >>> record_finished()  # no launcher: no-op
    """
    headline = "finished the script"
    record = error_record(headline, headline, kind=RecordKind.FINISHED)
    write_error_file(record, keep_existing=True)


def _record_exit(stop: SystemExit) -> None:
    """Say where the script called sys.exit with a failing code; the launcher names it."""
    if stop.code in (None, 0):
        record_finished()
        return
    frames = [f for f in traceback.extract_tb(stop.__traceback__) if not is_hidden(f.filename)]
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    headline = f"the script called sys.exit({stop.code!r}){where}"
    record = error_record(
        headline, headline, exitcode=stop.code if isinstance(stop.code, int) else 1
    )
    write_error_file(record, keep_existing=True)  # a preemption's record stays


def run_setup(environ: Mapping[str, str] | None = None) -> None:
    """Call the ``module:function`` that ``DDPKIT_WORKER_SETUP`` names, before the script.

    ddpkit's commands use it to hook into the workers they start (``ddpkit verify``
    registers its recorder this way), so the library never imports the commands.

    Example:
        >>> run_setup({})  # nothing named: nothing to do
        >>> run_setup({WORKER_SETUP_ENV: "ddpkit.x"})
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: DDPKIT_WORKER_SETUP='ddpkit.x' is not MODULE:FUNCTION
    """
    spec = (os.environ if environ is None else environ).get(WORKER_SETUP_ENV)
    if not spec:
        return
    module, _, function = spec.partition(":")
    if not module or not function:
        raise ConfigError(f"{WORKER_SETUP_ENV}={spec!r} is not MODULE:FUNCTION")
    getattr(importlib.import_module(module), function)()


if __name__ == "__main__":
    main()
