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
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from ddpkit.errors import NotInitializedError, RendezvousError
from ddpkit.failures import install_error_file_hook
from ddpkit.world import World

DEFAULT_TIMEOUT_S = 1800.0  # torch's own default for gloo; long collectives are legitimate

_current: World | None = None
_atexit_registered = False


def init(backend: str | None = None, timeout: float | timedelta = DEFAULT_TIMEOUT_S) -> World:
    """Join the job and return this process's :class:`World`.

    Reads the launcher's environment (torchrun / ``ddpkit run`` contract); with none, this is
    a world of one and no process group is created. ``backend`` defaults to nccl on CUDA and
    gloo otherwise. ``timeout`` (seconds) bounds the rendezvous and every collective.
    Calling it again returns the same world.

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
    world = World.detect(backend=backend)
    if world.device.type == "cuda":
        torch.cuda.set_device(world.device)
    if world.is_launched and not dist.is_initialized():
        _join_process_group(world, _as_timedelta(timeout))
    install_error_file_hook()  # so the launcher can name this rank if it fails
    _current = world
    _register_teardown()
    if world.is_main:
        print(f"ddpkit: {world.describe()}", flush=True)
    return world


def shutdown() -> None:
    """Leave the process group (if any) and forget the world. Safe to call twice.

    Example:
        >>> import ddpkit
        >>> ddpkit.shutdown()
    """
    global _current
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _current = None


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


def _join_process_group(world: World, timeout: timedelta) -> None:
    try:
        dist.init_process_group(
            backend=world.backend,
            init_method="env://",
            rank=world.rank,
            world_size=world.world_size,
            timeout=timeout,
        )
    except (RuntimeError, ValueError) as err:  # DistStoreError / DistNetworkError subclass these
        where = f"{world.master_addr}:{world.master_port}"
        raise RendezvousError(
            f"rank {world.rank} of {world.world_size} could not join the process group at "
            f"{where} (backend {world.backend}, timeout {timeout.total_seconds():.0f} s): "
            f"{_first_line(err)}. Check that rank 0 is running, that {where} is reachable "
            "from this host, and that every process was started with the same WORLD_SIZE."
        ) from err


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


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
        print(f"ddpkit: process group teardown failed at exit: {err}", file=sys.stderr)
