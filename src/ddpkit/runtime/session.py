"""Joining and leaving the job: the process group's init and teardown.

``init()`` detects the world, joins the process group when a launcher started this process
(env:// rendezvous through MASTER_ADDR/MASTER_PORT), pins the rank's device, and says once on
rank 0 what it chose. ``shutdown()`` leaves; it is also registered to run at exit, so teardown
happens even when training raises.

Example:
    >>> import ddpkit
    >>> world = ddpkit.init()          # no launcher: a world of one, no process group
    ddpkit: world size 1 ...
    >>> world.world_size
    1
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import atexit
import dataclasses
import faulthandler
import gc
import os
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import Store

from ddpkit._compat.c10d import import_before_the_group, process_groups
from ddpkit._core import log
from ddpkit._core.envvars import positive_int_var
from ddpkit._core.protocol import DEALING_ENV, REFERENCE_WORLD_ENV, failure_recorded
from ddpkit._core.text import first_line
from ddpkit.env.dns import is_address, wait_for_name
from ddpkit.env.initmethod import InitMethod, parse_init_method
from ddpkit.env.world import Backend, World
from ddpkit.errors import ConfigError, NotInitializedError, RendezvousError
from ddpkit.flightrecorder.arming import arm_flight_recorder
from ddpkit.runtime.errorfile import install_error_file_hook
from ddpkit.runtime.errorhook import install_short_errors
from ddpkit.runtime.filestore import mark_complete
from ddpkit.runtime.seeding import forget_seed, seed_everything
from ddpkit.runtime.stores import await_all_ranks, open_store
from ddpkit.runtime.watchdog import resolve_hang_timeout, start_watchdog, stop_watchdog

DEFAULT_TIMEOUT_S = 1800.0  # torch's own default for gloo; long collectives are legitimate
LOCAL_JOIN_TIMEOUT_S = 30.0  # ranks on one machine start within seconds of each other
REMOTE_JOIN_TIMEOUT_S = 300.0  # other machines may still be pulling images or data
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")

_current: World | None = None
_atexit_registered = False


def init(
    backend: Backend | None = None,
    timeout: float | timedelta = DEFAULT_TIMEOUT_S,
    *,
    init_method: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    join_timeout: float | None = None,
    seed: int | None = None,
    hang_timeout: float | None = None,
) -> World:
    """Join the job and return this process's :class:`World`.

    Reads the launcher's environment (torchrun / ``ddpkit run``, SLURM, OpenMPI); with none,
    this is a world of one and no process group is created. The tutorials' style works too:
    ``init_method`` is ``env://``, ``tcp://HOST:PORT`` or ``file:///PATH`` with ``rank`` and
    ``world_size`` given. ``backend`` defaults to nccl on CUDA and gloo otherwise.
    ``join_timeout`` (seconds) bounds how long ranks wait for each other at start (default
    30 on one machine, 1 more per rank past its cores, 300 across machines); ``timeout``
    bounds every collective afterwards.
    ``seed`` seeds every RNG identically on all ranks and is the base of the per-rank
    augmentation streams (see :mod:`ddpkit.runtime.seeding`). ``hang_timeout`` (seconds; default
    DDPKIT_HANG_TIMEOUT or 600, 0: off) bounds one step or collective: past it, every rank
    reports what it is doing and the job exits (see :mod:`ddpkit.runtime.watchdog`). Calling it
    again returns the same world.

    Example:
        >>> import ddpkit
        >>> ddpkit.init().rank
        ddpkit: world size 1 ...
        0
        >>> ddpkit.shutdown()
    """
    global _current
    if _current is not None:
        return _current
    install_short_errors()  # a bad setting below ends the script with one clear message
    if not faulthandler.is_enabled():  # a crash in native code (gloo's abort) shows the line
        faulthandler.enable(all_threads=True)
    if seed is not None:
        seed_everything(seed)
    method = parse_init_method(init_method) if init_method else None
    world = _with_endpoint(World.detect(backend=backend, rank=rank, world_size=world_size), method)
    if world.device.type == "cuda":
        torch.cuda.set_device(world.device)
    hang_timeout = resolve_hang_timeout(hang_timeout)  # a bad value fails before joining
    store = None
    if (world.is_launched or method is not None) and not dist.is_initialized():
        arm_flight_recorder()  # before the group exists: a hang is then named at the collective
        method = method or InitMethod("env")
        store = _join_process_group(world, method, _as_timedelta(timeout), join_timeout)
    start_watchdog(hang_timeout, world.rank, world.world_size, store)
    _current = world
    log.set_rank(world.rank)  # ddpkit's notices come from rank 0 only
    _register_teardown()
    install_error_file_hook()  # so the launcher can name this rank if it fails
    log.logger.info(f"{world.describe()}{_backend_reason(backend, world)}")
    return world


def shutdown() -> None:
    """Leave the process group (if any) and forget the world. Safe to call twice.

    Example:
        >>> import ddpkit
        >>> ddpkit.shutdown()
    """
    global _current
    stop_watchdog(finished=not failure_recorded())
    if dist.is_available() and dist.is_initialized():
        _leave_process_groups()
    _current = None
    log.set_rank(None)
    forget_seed()


def _leave_process_groups() -> None:
    # DDP's reducer keeps the gloo group (and its last works' tensors) alive through
    # reference cycles; freed during interpreter finalization, gloo's threads would drop
    # those tensors without the GIL and abort the process ("terminate called without an
    # active exception", exit 134). So they are freed now, while the interpreter is whole.
    # But not by the reducer: its release holds the GIL while the group's destructor waits
    # for gloo's work lock, and a gloo thread that holds that lock while it frees the last
    # collective's tensors waits for the GIL (a hang at exit: 1 in 15 two-rank jobs
    # that end with a barrier). The groups' Python handles, held across the collection,
    # are the last owners: their release lets go of the GIL first.
    groups = process_groups()
    dist.destroy_process_group()
    gc.collect()
    groups.clear()


def current_world() -> World:
    """The world set by ``ddpkit.init()``; raises :class:`NotInitializedError` before it.

    Example:
        >>> import ddpkit
        >>> _ = ddpkit.init()
        ddpkit: world size 1 ...
        >>> ddpkit.current_world().world_size
        1
        >>> ddpkit.shutdown()
    """
    if _current is None:
        raise NotInitializedError(
            "ddpkit.init() has not been called in this process: call it once at the start "
            "of your script, before prepare_model / prepare_loader / Trainer"
        )
    return _current


def world_or_none() -> World | None:
    """The world if ``init()`` ran, else None (for helpers that work either way)."""
    return _current


def _join_process_group(
    world: World, method: InitMethod, timeout: timedelta, join_timeout: float | None
) -> Store:
    join_s = join_timeout if join_timeout is not None else default_join_timeout(world, method)
    where = method.path if method.kind == "file" else f"{world.master_addr}:{world.master_port}"
    if method.kind != "file" and world.master_addr and not is_address(world.master_addr):
        wait_for_name(world.master_addr)  # a pod's DNS name appears only once the pod runs
    store = open_store(world, method, join_s)
    await_all_ranks(store, world, join_s, str(where))
    if method.path is not None:  # a rank arriving at this file from now on is another job's
        mark_complete(method.path)
    import_before_the_group()  # else the group outlives destroy_process_group
    try:
        dist.init_process_group(
            backend=world.backend,
            store=store,
            rank=world.rank,
            world_size=world.world_size,
            timeout=timeout,
        )
    except (RuntimeError, ValueError) as err:  # DistStoreError / DistNetworkError subclass these
        raise RendezvousError(
            f"rank {world.rank} of {world.world_size} met its peers at {where} but the "
            f"{world.backend} process group failed to start: {first_line(err)}"
        ) from err
    return store


def default_join_timeout(world: World, method: InitMethod) -> float:
    """30 s when every rank is on this machine (loopback or a file), and a second more for
    each rank past its cores; 300 s across machines.

    Ranks past the cores start one after another: 64 CPU ranks of a script that imports
    scikit-learn took over 30 s to all arrive on 2 cores (the scale tier, make scale).

    Example:
        >>> default_join_timeout(World(), InitMethod("file", path="/tmp/pg"))
        30.0
    """
    local = method.kind == "file" or world.master_addr in _LOOPBACK_NAMES
    if not local:
        return REMOTE_JOIN_TIMEOUT_S
    return LOCAL_JOIN_TIMEOUT_S + max(0, world.world_size - len(os.sched_getaffinity(0)))


def _with_endpoint(world: World, method: InitMethod | None) -> World:
    """tcp:// names rank 0's address itself; record it in the world."""
    if method is None or method.kind != "tcp":
        return world
    return dataclasses.replace(world, master_addr=method.host, master_port=method.port)


def _backend_reason(requested: str | None, world: World) -> str:
    if requested is not None:
        return ""
    return " (CUDA is available)" if world.device.type == "cuda" else " (no CUDA GPU visible)"


def _as_timedelta(timeout: float | timedelta) -> timedelta:
    return timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))


def _register_teardown() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_teardown_at_exit)
        _atexit_registered = True


def _teardown_at_exit() -> None:
    try:
        shutdown()
    except Exception as err:  # exiting anyway; a failed teardown must not mask the real error
        log.logger.warning(f"process group teardown failed at exit: {err}", extra=log.EVERY_RANK)


def reference_world_size(environ: Mapping[str, str] | None = None) -> int | None:
    """In ``ddpkit verify``'s single-process reference: the world size it stands in for.

    Batches are then planned as for that many ranks and one process reads all their shards,
    so its global batch, learning rate and sample order are those of the N-rank run.

    Example:
        >>> import ddpkit
        >>> _ = ddpkit.init()
        ddpkit: world size 1 ...
        >>> reference_world_size({REFERENCE_WORLD_ENV: "2"})
        2
        >>> ddpkit.shutdown()
    """
    size = positive_int_var(REFERENCE_WORLD_ENV, environ)
    if size is None:
        return None
    if current_world().world_size != 1:
        raise ConfigError(
            f"{REFERENCE_WORLD_ENV} is set (by ddpkit verify, for its single-process "
            f"reference) but this process is one of {current_world().world_size}; unset it"
        )
    return size


def reference_dealing(environ: Mapping[str, str] | None = None) -> list[int]:
    """In ``ddpkit verify``'s reference for a fault-tolerant run with a failure: how many
    slices (ranks' batches) each committed step of the groups' run trained, as its group 0
    recorded them (a step a group missed or healed in took fewer); empty otherwise.

    Example:
        >>> reference_dealing({DEALING_ENV: "4,4,2,4"})
        [4, 4, 2, 4]
    """
    text = (os.environ if environ is None else environ).get(DEALING_ENV, "")
    return [int(n) for n in text.split(",") if n]
