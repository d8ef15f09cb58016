"""The rendezvous store, opened by ddpkit so that every failure to meet has a clear error.

ddpkit creates torch's own ``TCPStore`` / ``FileStore`` (rather than letting
``init_process_group`` do it behind a URL) for one reason: it can then record which ranks
arrived. Each rank sets ``ddpkit/join/<rank>``; rank 0 waits for all of them up to the join
timeout and publishes a verdict, so every rank stops with the same message, "ranks 2,3 did
not join 127.0.0.1:29500 within 30 s", instead of hanging for gloo's 30 minutes.

Example:
    >>> JOIN_PREFIX
    'ddpkit/join/'
"""

from __future__ import annotations

from datetime import timedelta

# The store classes' real home; torch.distributed re-exports them, but only this module has
# type stubs for them.
from torch.distributed import Store, TCPStore

from ddpkit._core.system import listening_pid
from ddpkit._core.text import ranks_text
from ddpkit.env.initmethod import InitMethod
from ddpkit.env.world import World
from ddpkit.errors import RendezvousError
from ddpkit.runtime.filestore import open_file_store

JOIN_PREFIX = "ddpkit/join/"
_VERDICT = "ddpkit/join/verdict"
_OK = "ok"
_GRACE_S = 10.0  # other ranks wait this much longer than rank 0 for its verdict


def open_store(world: World, method: InitMethod, join_timeout: float) -> Store:
    """Open the store ``method`` names (rank 0 hosts a TCP store unless an agent does).

    Example::

        open_store(world, InitMethod("file", path="/tmp/pg"), 30)
    """
    if method.kind == "file":
        assert method.path is not None
        return open_file_store(method.path, world.world_size, join_timeout)
    host, port = _tcp_endpoint(world, method)
    # torch's agent hosts a store at MASTER_ADDR:MASTER_PORT only: a tcp:// URL names
    # another endpoint, which rank 0 hosts itself, agent or not.
    agent_hosts_it = world.agent_store and method.kind == "env"
    if world.rank == 0 and not agent_hosts_it:
        return _host_tcp_store(host, port, world.world_size, join_timeout)
    return _connect_tcp_store(host, port, world, join_timeout)


def await_all_ranks(store: Store, world: World, join_timeout: float, where: str) -> None:
    """Announce this rank, and return only once every rank has; else a RendezvousError.

    Example::

        await_all_ranks(store, world, 30, "127.0.0.1:29500")
    """
    store.set(f"{JOIN_PREFIX}{world.rank}", "1")
    if world.rank == 0:
        verdict = _collect_joins(store, world.world_size, join_timeout, where)
        store.set(_VERDICT, verdict)
    else:
        verdict = _await_verdict(store, join_timeout, where)
    if verdict != _OK:
        raise RendezvousError(verdict)


def _collect_joins(store: Store, world_size: int, join_timeout: float, where: str) -> str:
    keys = [f"{JOIN_PREFIX}{rank}" for rank in range(world_size)]
    try:
        store.wait(keys, timedelta(seconds=join_timeout))
        return _OK
    except RuntimeError:  # torch's DistStoreError (a timeout) subclasses RuntimeError
        missing = [rank for rank, key in enumerate(keys) if not store.check([key])]
        return (
            f"{ranks_text(missing)} did not join {where} within {join_timeout:.0f} s "
            f"({world_size - len(missing)} of {world_size} joined). Check that every rank was "
            "started, with the same world size and init method, and can reach this address."
        )


def _await_verdict(store: Store, join_timeout: float, where: str) -> str:
    try:
        store.wait([_VERDICT], timedelta(seconds=join_timeout + _GRACE_S))
        return bytes(store.get(_VERDICT)).decode()
    except RuntimeError:
        return (
            f"rank 0 did not confirm the rendezvous at {where} within "
            f"{join_timeout + _GRACE_S:.0f} s; it may have crashed: check its output"
        )


def _tcp_endpoint(world: World, method: InitMethod) -> tuple[str, int]:
    if method.kind == "tcp":
        assert method.host is not None and method.port is not None
        return method.host, method.port
    if world.master_addr is None or world.master_port is None:
        raise RendezvousError(
            "env:// needs MASTER_ADDR and MASTER_PORT (rank 0's address and a free port); "
            "launch with `ddpkit run`, which sets them, or export both"
        )
    return world.master_addr, world.master_port


def _host_tcp_store(host: str, port: int, world_size: int, join_timeout: float) -> Store:
    try:
        return TCPStore(
            host, port, world_size, is_master=True,
            timeout=timedelta(seconds=join_timeout), wait_for_workers=False, multi_tenant=True,
        )  # fmt: skip
    except RuntimeError as err:
        if "EADDRINUSE" in str(err) or "address already in use" in str(err).lower():
            raise RendezvousError(
                f"{host}:{port} is in use{_owner_text(port)}: rank 0 cannot host the "
                "rendezvous there. Pass another port (MASTER_PORT / --master-port) or stop "
                "the process holding it."
            ) from None
        raise RendezvousError(f"rank 0 could not listen on {host}:{port}: {err}") from err


def _connect_tcp_store(host: str, port: int, world: World, join_timeout: float) -> Store:
    try:
        return TCPStore(
            host, port, world.world_size, is_master=False,
            timeout=timedelta(seconds=join_timeout),
        )  # fmt: skip
    except RuntimeError as err:
        raise RendezvousError(
            f"rank {world.rank} could not reach the rendezvous store at {host}:{port} within "
            f"{join_timeout:.0f} s: rank 0 is not running there, or the address or port is "
            "not reachable from this host (firewall, wrong MASTER_ADDR/MASTER_PORT)"
        ) from err


def _owner_text(port: int) -> str:
    pid = listening_pid(port)
    return f" (by pid {pid})" if pid is not None else ""
