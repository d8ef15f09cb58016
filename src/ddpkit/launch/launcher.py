"""Starting worker processes, through torch's elastic launcher.

``run_script`` (behind ``ddpkit run``) and ``spawn`` (in Python) both build a torch
``LaunchConfig`` and hand it to ``elastic_launch``: torch's agent creates, watches, restarts
and stops the workers and publishes torchrun's environment contract to them. ddpkit chooses
the rendezvous (see ``ddpkit.launch.plan``), sensible per-worker thread counts, ties each worker
to the launcher's life (:mod:`ddpkit.launch.lifeline`), has torch's agent pass SIGUSR1 to workers
as it does SIGTERM (SLURM's warning before a time limit), and turns failures, preemptions and
signals into short, typed errors.

Example (a module-level function: workers receive it pickled)::

    import ddpkit

    def rank_times_ten():
        return ddpkit.init().rank * 10

    ddpkit.spawn(rank_times_ten, 2)   # [0, 10]
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.util
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from torch.distributed import DistNetworkError
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import elastic_launch

from ddpkit._compat.elastic import report_every_failure
from ddpkit._core.log import command_logger
from ddpkit._core.protocol import (
    FORWARDED_SIGNALS,
    LAUNCHER_PID_ENV,
    LAUNCHER_REPORTS_ENV,
    LIVE_CONSOLE_ENV,
    MEMORY_SNAPSHOTS_ENV,
    ONE_STREAM_ENV,
    PREEMPTED_EXIT_CODE,
    STOP_SIGNALS,
    RecordKind,
)
from ddpkit._core.system import listening_pid
from ddpkit._core.torchversion import torch_at_least
from ddpkit.env.dns import is_address, wait_for_name
from ddpkit.errors import (
    ConfigError,
    DdpkitError,
    PreemptedError,
    RendezvousError,
    StoppedBySignalError,
)
from ddpkit.launch.console.mergedoutput import MergedConsole, MergedLogsSpecs
from ddpkit.launch.failures import diagnose, recorded
from ddpkit.launch.lifeline import Tied
from ddpkit.launch.plan import LaunchPlan, run_id, to_launch_config, worker_env_defaults
from ddpkit.launch.program import Program
from ddpkit.launch.scratch import launch_folder, memory_folder
from ddpkit.launch.warm.forkserver import start_warm_server, warm_start_method
from ddpkit.launch.warm.interactive import start_method_for


def spawn(
    fn: Callable[..., Any],
    nprocs: int,
    *args: Any,
    nnodes: int = 1,
    node_rank: int = 0,
    master: str | None = None,
) -> list[Any]:
    """Run ``fn(*args)`` in ``nprocs`` worker processes on this node; results by local rank.

    Each worker gets torchrun's environment, so ``ddpkit.init()`` inside ``fn`` joins the
    group. Across machines, call it on every node with the same ``nnodes`` and ``master``
    ("ADDR:PORT" of node 0) and this node's ``node_rank``; ranks follow the tutorials'
    ``global_rank = node_rank * nprocs + local_rank``. ``fn`` and ``args`` must be picklable
    (a module-level function); one typed into a notebook or ``python -i`` works too, its
    workers forked (:mod:`ddpkit.launch.warm.interactive`). If a worker raises,
    :class:`WorkerFailedError` carries its rank and traceback, and the other workers are
    stopped.

    Example::

        ddpkit.spawn(train, 2, "runs/exp1")   # [None, None]
        ddpkit.spawn(train, 4, nnodes=2, node_rank=1, master="10.0.0.1:29500")
    """
    plan = LaunchPlan(
        nproc=nprocs,
        nnodes=str(nnodes),
        node_rank=node_rank if nnodes > 1 or master else None,
        master=master,
        start_method=start_method_for(fn),  # fork for a function typed into a notebook
    )
    _check_picklable(fn, args)
    with _launch_scope(worker_env_defaults(plan)) as log_dir:
        try:
            results = elastic_launch(to_launch_config(plan, log_dir), Tied(fn))(*args)
        except (ChildFailedError, SignalException) as err:
            raise launch_outcome(err, log_dir, nprocs) from None
    first = node_rank * nprocs
    return [results[first + local] for local in range(nprocs)]


def run_script(
    plan: LaunchPlan,
    program: Program | str,
    worker_env: Mapping[str, str] | None = None,
) -> None:
    """Launch ``program`` (a script path, or a :class:`Program`) as ``plan.nproc`` workers.

    Any torchrun-style script works unchanged: it sees RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, plus ``worker_env`` (settings the user
    asked for, which win over the environment). Raises :class:`WorkerFailedError` when a
    worker fails, :class:`PreemptedError` when the workers checkpointed and stopped on
    SIGTERM / SIGUSR1, and :class:`StoppedBySignalError` when the launcher was interrupted.

    Example::

        run_script(LaunchPlan(nproc=2), Program("examples/wine.py", ("--epochs", "5")))
    """
    program = program if isinstance(program, Program) else Program(program)
    program.check()  # a script that cannot start fails here, once, before any worker
    command, args = program.entrypoint()
    defaults = worker_env_defaults(plan)
    started = _start_method_of(plan, command)
    _announce(plan, defaults, started)
    _wait_for_master_name(plan)
    env = {**defaults, **_quiet_workers(plan), **console_env(plan), **(worker_env or {})}
    if callable(command) and plan.start_method == "forkserver":
        start_warm_server(env)  # `ddpkit run` started it already, once its flags were parsed
    memory = plan.memory_snapshots and plan.max_restarts > 0  # no restart: nothing to keep
    scope = _launch_scope(env, plan.log_dir, memory)
    with scope as log_dir, _console(plan, log_dir) as specs:
        config = to_launch_config(plan, log_dir, specs)
        # a function worker (--run-path) carries this launch's environment and lifeline
        entry = Tied(command) if callable(command) else command
        try:
            elastic_launch(config, entry)(*args)
        except (ChildFailedError, SignalException) as err:
            raise launch_outcome(err, log_dir, plan.nproc) from None
        except DistNetworkError as err:
            raise store_failure(plan, err) from None


def store_failure(plan: LaunchPlan, err: DistNetworkError) -> RendezvousError:
    """torch's 40-line DistNetworkError from hosting the rendezvous store, in one line.

    Example:
        >>> err = DistNetworkError("failed to listen ... EADDRINUSE, address already in use")
        >>> plan = LaunchPlan(nproc=2, nnodes="2", node_rank=0, master="10.0.0.1:65000")
        >>> print(store_failure(plan, err))
        10.0.0.1:65000 is in use: node 0 cannot host the rendezvous store there. Pick ...
    """
    endpoint = plan.master or plan.rdzv_endpoint or "the rendezvous endpoint"
    if "EADDRINUSE" not in str(err):
        return RendezvousError(f"the rendezvous store at {endpoint} failed: {err}")
    port = endpoint.rsplit(":", 1)[-1]
    pid = listening_pid(int(port)) if port.isdigit() else None
    owner = f" (by pid {pid})" if pid is not None else ""
    return RendezvousError(
        f"{endpoint} is in use{owner}: node 0 cannot host the rendezvous store there. Pick "
        f"another port (--master ADDR:PORT or --master-port) or stop "
        + (f"pid {pid}" if pid is not None else "the process holding it"),
        retriable=False,
    )


@contextlib.contextmanager
def _console(plan: LaunchPlan, log_dir: str) -> Iterator[MergedLogsSpecs | None]:
    """The merged console of ``plan`` around a launch (None: output goes as torchrun's flags
    say); whatever the workers printed is out before the launch's outcome is reported."""
    if not plan.merges_output:
        yield None
        return
    with MergedConsole(plan.merge_window, plan.nproc) as console:
        yield MergedLogsSpecs(log_dir, console)


def console_env(plan: LaunchPlan, terminal: bool | None = None) -> dict[str, str]:
    """What the workers are told when the merged console shows their output: write stderr
    into stdout's file (one file keeps the order the rank wrote them in), unbuffered (or
    their lines reach the console in bursts); when the console is a terminal (``terminal``:
    the launcher's stdout), draw progress bars and fit them to its width, less the prefix.

    Example:
        >>> sorted(console_env(LaunchPlan(nproc=2), terminal=False)) == [ONE_STREAM_ENV,
        ...                                                             "PYTHONUNBUFFERED"]
        True
        >>> console_env(LaunchPlan(nproc=2, merge_output=False))
        {}
    """
    if not plan.merges_output:
        return {}
    env = {ONE_STREAM_ENV: "1", "PYTHONUNBUFFERED": os.environ.get("PYTHONUNBUFFERED", "1")}
    if sys.stdout.isatty() if terminal is None else terminal:
        env[LIVE_CONSOLE_ENV] = "1"
        prefix = len(f"[rank{plan.nproc - 1}] ")
        columns = shutil.get_terminal_size().columns
        env["COLUMNS"] = os.environ.get("COLUMNS", str(max(columns - prefix, 20)))
    return env


def _quiet_workers(plan: LaunchPlan) -> dict[str, str]:
    # The launcher prints the blamed rank's traceback once; with --redirects or --tee each
    # rank's log file keeps its own.
    return {LAUNCHER_REPORTS_ENV: "1"} if plan.redirects == plan.tee == "0" else {}


def launch_outcome(
    err: ChildFailedError | SignalException, log_dir: str, local_world: int | None = None
) -> DdpkitError:
    """What ended a launch, as ddpkit's error: a preemption, a signal, or a failed worker
    (``local_world``: this node's worker count, to tell which ranks finished normally).

    Example:
        >>> launch_outcome(SignalException("", signal.SIGINT), "/nonexistent").exitcode
        130
    """
    if isinstance(err, SignalException):
        return _signal_outcome(signal.Signals(err.sigval), log_dir)
    diagnosis = diagnose(err, log_dir, local_world)
    cause = diagnosis.cause
    if cause.exitcode == PREEMPTED_EXIT_CODE and cause.kind is RecordKind.PREEMPTED:
        return PreemptedError(cause.text)
    return diagnosis.error()


def _signal_outcome(signum: signal.Signals, log_dir: str) -> DdpkitError:
    """The launcher got ``signum``: what the workers recorded says how far they got."""
    records = recorded(log_dir)
    stops = [r.text for r in records if r.kind is RecordKind.PREEMPTED]
    if stops:
        return PreemptedError(stops[0])
    if signum.name not in STOP_SIGNALS:
        return StoppedBySignalError(signum.name, signum)
    training = [r.text for r in records if r.kind is RecordKind.TRAINING]
    if training:  # they trained, but were stopped before a step where they could save
        return PreemptedError(
            f"stopped by {signum.name} during training ({training[0]}) before they reached a "
            "step where they could checkpoint, so nothing new was saved; run the same command "
            "again to resume from the last checkpoint"
        )
    return PreemptedError(f"stopped by {signum.name} while starting; run it again")


def _check_picklable(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    # Workers are started with "spawn": fn and args travel pickled. A lambda or a nested
    # function would otherwise fail inside the child with a long, unrelated traceback.
    try:
        pickle.dumps((fn, args))
    except Exception as err:
        name = getattr(fn, "__qualname__", repr(fn))
        raise ConfigError(
            f"spawn() sends {name} and its arguments to new processes by pickling, which "
            f"failed ({err}); define the function at module level and pass picklable arguments"
        ) from None


@contextlib.contextmanager
def _launch_scope(
    env_values: dict[str, str], kept_log_dir: str | None = None, memory: bool = False
) -> Iterator[str]:
    """A log folder for one launch (temporary, or the user's ``--log-dir``, which is kept),
    and the workers' environment around it.

    Workers inherit ``env_values``. Our own environment and signal handlers are restored
    entirely afterwards: torch's launcher also writes to the caller's environment
    (TORCHELASTIC_*) and installs its own signal handlers, and an in-Python ``spawn`` must not
    leave those behind in the user's process. ``memory``: the workers keep each step in a
    folder of the node's memory (:func:`~ddpkit.launch.scratch.memory_folder`) meanwhile.
    """
    report_every_failure()  # warm workers: every one that ended badly, not the first only
    saved = dict(os.environ)
    handlers = _signal_handlers()
    os.environ.update(env_values)
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # what workers tie their life to
    _forward_sigusr1()
    torch_reports = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    saved_level = torch_reports.level
    if "LOGLEVEL" not in os.environ:  # torchrun's knob for its own logs wins
        # "failed (exitcode: 1) local_rank: 0" and "Sending process N closing signal": the
        # summary says which rank failed, why, and what happened to the others.
        torch_reports.setLevel(logging.CRITICAL)
    try:
        with (
            launch_folder() as scratch,  # dead launchers' swept first
            memory_folder(memory) as snapshots,
            _temporary_files_in(scratch),
        ):
            if snapshots is not None:
                os.environ[MEMORY_SNAPSHOTS_ENV] = snapshots
            if kept_log_dir is not None:
                Path(kept_log_dir).mkdir(parents=True, exist_ok=True)
            yield scratch if kept_log_dir is None else kept_log_dir
    finally:
        torch_reports.setLevel(saved_level)
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)
        for number, handler in handlers.items():  # torch's agent installs its own, for good
            signal.signal(number, handler)


@contextlib.contextmanager
def _temporary_files_in(folder: str) -> Iterator[None]:
    """This process's temporary files made inside ``folder`` while the launch runs (it is
    removed after): torch's process starter names a ``pytorch-errorfile-*.pickle`` for each
    function worker, which a worker that raises writes and nobody removes. multiprocessing's
    own folder, kept for the process's life, is made where it always is, first."""
    multiprocessing.util.get_temp_dir()
    saved = tempfile.tempdir
    tempfile.tempdir = folder
    try:
        yield
    finally:
        tempfile.tempdir = saved


def _signal_handlers() -> dict[signal.Signals, Any]:
    """The caller's handlers for the signals torch's agent takes over (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    numbers = [getattr(signal, name, None) for name in FORWARDED_SIGNALS]
    found = {n: signal.getsignal(n) for n in numbers if n is not None}
    return {n: handler for n, handler in found.items() if handler is not None}


def _forward_sigusr1() -> None:
    """On torch < 2.10 (no ``signals_to_handle``) stop the agent on SIGUSR1, as newer torch
    does: it then sends SIGUSR1 to every worker, which checkpoints and exits with 75."""
    if torch_at_least("2.10") or threading.current_thread() is not threading.main_thread():
        return  # newer torch forwards it itself; off the main thread no handler can be set

    def stop_agent(signum: int, _frame: object) -> None:
        raise SignalException(f"Process {os.getpid()} got signal: {signum}", signal.Signals(signum))

    signal.signal(signal.SIGUSR1, stop_agent)


def _wait_for_master_name(plan: LaunchPlan) -> None:
    """Across nodes, node 0's name must resolve before torch's rendezvous looks it up once
    and fails (a pod's DNS name appears only once the pod runs)."""
    endpoint = plan.master or plan.rdzv_endpoint
    if endpoint is None:
        return
    host = endpoint.rpartition(":")[0].strip("[]")
    if not is_address(host):
        wait_for_name(host, say=command_logger("run").info)


def _start_method_of(plan: LaunchPlan, command: object) -> str:
    """How the workers start, for the start-up line: a ``python`` each, or (--run-path) by
    ``--start-method`` from a function; forkserver's server imports torch once for all."""
    if not callable(command):
        return ""
    if plan.start_method == "forkserver" and warm_start_method() == "forkserver":
        return (
            "; workers forked from a server that imported torch once (--fresh-workers: a "
            "python each)"
        )
    return f"; workers started by {plan.start_method} from a function (--run-path)"


def _announce(plan: LaunchPlan, defaults: dict[str, str], started: str = "") -> None:
    chosen = ", ".join(f"{k}={v}" for k, v in sorted(defaults.items()))
    where = {
        "local": "",
        "static": f", node {plan.node_rank} of {plan.nnodes} (master {plan.master})",
        "dynamic": f", {plan.nnodes} node(s) meeting at {plan.rdzv_endpoint} (id {run_id(plan)})",
    }[plan.mode]
    if plan.contract:  # a pod: which controller said so, and from which variables
        where = f"; {plan.contract}"
    command_logger("run").info(
        f"{plan.nproc} worker(s) on this node{where}{started}"
        + (f"; worker defaults {chosen} (set them to override)" if chosen else "")
    )
