"""Starting worker processes, through torch's elastic launcher.

``run_script`` (behind ``ddpkit run``) and ``spawn`` (in Python) both build a torch
``LaunchConfig`` and hand it to ``elastic_launch``: torch's agent creates, watches and stops
the workers and publishes torchrun's environment contract to them. ddpkit chooses the
single-node rendezvous (a c10d store on loopback, port picked by the OS at bind time, so no
find-then-bind race), sensible per-worker thread counts, and turns failures into short,
typed errors.

Example:
    >>> import ddpkit
    >>> def rank_times_ten():
    ...     return ddpkit.init().rank * 10
    >>> ddpkit.spawn(rank_times_ten, 2)  # doctest: +SKIP
    [0, 10]
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from ddpkit.errors import ConfigError
from ddpkit.failures import root_cause

LOOPBACK = "127.0.0.1"
RDZV_TIMEOUT_S = 900  # how long workers may take to join; torch's default


def local_launch_config(nproc: int, log_dir: str, max_restarts: int = 0) -> LaunchConfig:
    """A single-node launch of ``nproc`` workers with the store on loopback.

    ``log_dir`` receives torch's per-worker error files (read back when a worker fails).

    Example:
        >>> local_launch_config(2, tempfile.mkdtemp()).nproc_per_node
        2
    """
    check_nproc(nproc)
    return LaunchConfig(
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"ddpkit-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        # Port 0: the store binds a free port itself; workers get it as MASTER_PORT.
        rdzv_endpoint=f"{LOOPBACK}:0",
        rdzv_configs={"timeout": RDZV_TIMEOUT_S, "is_host": True},
        local_addr=LOOPBACK,
        max_restarts=max_restarts,
        monitor_interval=0.1,
        start_method="spawn",
    )


def spawn(fn: Callable[..., Any], nprocs: int, *args: Any) -> list[Any]:
    """Run ``fn(*args)`` in ``nprocs`` local worker processes; return results by rank.

    Each worker gets torchrun's environment, so ``ddpkit.init()`` inside ``fn`` joins the
    group. ``fn`` and ``args`` must be picklable (a module-level function). If a worker
    raises, :class:`WorkerFailedError` carries its rank and traceback; the others are stopped.

    Example:
        >>> ddpkit.spawn(train, 2, "runs/exp1")  # doctest: +SKIP
        [None, None]
    """
    check_nproc(nprocs)
    _check_picklable(fn, args)
    with _launch_scope(worker_env_defaults(nprocs)) as log_dir:
        try:
            results = elastic_launch(local_launch_config(nprocs, log_dir), fn)(*args)
        except ChildFailedError as err:
            raise root_cause(err, log_dir) from None
    return [results[rank] for rank in range(nprocs)]


def run_script(nproc: int, script: str, script_args: list[str], max_restarts: int = 0) -> None:
    """Launch ``python script *script_args`` as ``nproc`` workers on this node.

    Any torchrun-style script works unchanged: it sees RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Raises :class:`WorkerFailedError` when a
    worker fails.

    Example:
        >>> run_script(2, "examples/wine.py", ["--epochs", "5"])  # doctest: +SKIP
    """
    check_nproc(nproc)
    path = check_script(script)
    defaults = worker_env_defaults(nproc)
    _announce(nproc, defaults)
    with _launch_scope(defaults) as log_dir:
        config = local_launch_config(nproc, log_dir, max_restarts=max_restarts)
        try:
            elastic_launch(config, sys.executable)("-u", str(path), *script_args)
        except ChildFailedError as err:
            raise root_cause(err, log_dir) from None


def check_nproc(nproc: object) -> None:
    """Reject a process count that cannot work, naming the value.

    Example:
        >>> check_nproc(0)
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: --nproc must be a positive integer (got 0)
    """
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise ConfigError(f"--nproc must be a positive integer (got {nproc!r})")


def check_script(script: str) -> Path:
    """The script's path, or a ConfigError naming what is wrong with it.

    Example:
        >>> check_script("no/such/train.py")
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: script no/such/train.py does not exist (looked in ...)
    """
    path = Path(script)
    if not path.exists():
        raise ConfigError(f"script {script} does not exist (looked in {Path.cwd()})")
    if not path.is_file():
        raise ConfigError(
            f"script {script} is a {'directory' if path.is_dir() else 'special file'}"
        )
    return path


def worker_env_defaults(nproc: int) -> dict[str, str]:
    """Environment defaults for local workers; variables the user already set are kept.

    OMP_NUM_THREADS splits the cores between workers (oversubscribed threads make CPU
    training slower, not faster); GLOO_SOCKET_IFNAME keeps single-node gloo on loopback.

    Example:
        >>> "OMP_NUM_THREADS" in worker_env_defaults(2) or "OMP_NUM_THREADS" in os.environ
        True
    """
    defaults = {"OMP_NUM_THREADS": str(max(1, _usable_cores() // nproc))}
    loopback = _loopback_interface()
    if loopback is not None:
        defaults["GLOO_SOCKET_IFNAME"] = loopback
    return {k: v for k, v in defaults.items() if k not in os.environ}


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
def _launch_scope(env_values: dict[str, str]) -> Iterator[str]:
    """A temporary log folder for one launch, and the workers' environment around it.

    Workers inherit ``env_values``. Our own environment is restored entirely afterwards:
    torch's launcher also writes to the caller's (TORCHELASTIC_*), and an in-Python ``spawn``
    must not leave that behind in the user's process.
    """
    saved = dict(os.environ)
    os.environ.update(env_values)
    try:
        with tempfile.TemporaryDirectory(prefix="ddpkit-launch-") as log_dir:
            yield log_dir
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)


def _announce(nproc: int, defaults: dict[str, str]) -> None:
    chosen = ", ".join(f"{k}={v}" for k, v in sorted(defaults.items()))
    print(
        f"ddpkit run: {nproc} worker(s) on this node"
        + (f"; worker defaults {chosen} (set them to override)" if chosen else ""),
        file=sys.stderr,
        flush=True,
    )


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _loopback_interface() -> str | None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)
