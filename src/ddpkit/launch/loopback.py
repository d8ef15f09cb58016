"""Single-node rendezvous whose store listens on loopback only.

torch's ``TCPStore`` listens on every interface even when given 127.0.0.1, so a one-machine
job started the usual way (``torchrun --standalone``) opens an unauthenticated port to the
network. This handler binds the socket to 127.0.0.1 itself, on a port the OS picks at bind
time (no find-then-bind race), and hands it to ``TCPStore(master_listen_fd=...)``. It plugs
into torch's elastic agent through torch's own rendezvous registry, so the agent, worker
management and restarts are torch's. Each round (first start, every restart) gets a fresh
store, as torch's c10d backend does.

Example:
    >>> register_loopback_backend()
    'ddpkit-loopback'
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from torch.distributed import PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    rendezvous_handler_registry,
)

from ddpkit._core.system import listening_socket
from ddpkit._core.torchversion import torch_at_least

BACKEND = "ddpkit-loopback"
LOOPBACK = "127.0.0.1"
# Before torch 2.8 the libuv server cannot adopt a listening socket (master_listen_fd).
_LIBUV_OPTION = {} if torch_at_least("2.8") else {"use_libuv": False}


class LoopbackRendezvous(RendezvousHandler):
    """One node, one agent: the store is hosted here, on 127.0.0.1, fresh each round.

    Example:
        >>> LoopbackRendezvous("job1", timeout_s=60).get_run_id()
        'job1'
    """

    def __init__(self, run_id: str, timeout_s: float) -> None:
        self._run_id = run_id
        self._timeout = timedelta(seconds=timeout_s)
        self._store: TCPStore | None = None

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True  # workers connect to this store (MASTER_ADDR/MASTER_PORT) as clients

    def next_rendezvous(self) -> RendezvousInfo:
        listening, port = listening_socket(LOOPBACK)
        self._store = TCPStore(
            LOOPBACK, port, None, True, self._timeout,
            wait_for_workers=False, multi_tenant=True, master_listen_fd=listening,
            **_LIBUV_OPTION,
        )  # fmt: skip
        return RendezvousInfo(
            PrefixStore(self._run_id, self._store),
            rank=0,
            world_size=1,
            bootstrap_store_info=RendezvousStoreInfo(LOOPBACK, port),
        )

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0  # nobody else can join a one-node job

    def get_run_id(self) -> str:
        return self._run_id

    def shutdown(self) -> bool:
        self._store = None
        return True


def register_loopback_backend() -> str:
    """Make the backend known to torch's registry (once); returns its name.

    Example:
        >>> register_loopback_backend() == BACKEND
        True
    """
    with contextlib.suppress(ValueError):  # already registered by an earlier launch
        rendezvous_handler_registry.register(BACKEND, _create_handler)
    return BACKEND


def _create_handler(params: RendezvousParameters) -> RendezvousHandler:
    return LoopbackRendezvous(params.run_id, float(params.get_as_int("timeout", 900) or 900))
