"""**Experimental.** How a replica group of a fault-tolerant job heals, and where the groups
meet: the transport that fetches the run's state from a live peer, and the lighthouse.

torchft's own HTTP transport unpickles what a peer sends (``weights_only=False``, for
optimizer and scheduler objects). ddpkit's state is tensors, numbers and dicts only, so a
group here loads a peer's state with ``weights_only=True``, as every ddpkit checkpoint is
loaded, and notes what it received: from which peer, over which local address and
interface (a heal over the wrong interface cost torchft's users 800 s, torchft#329), how
many bytes and how long.

Imported only after :func:`~ddpkit.faulttolerance.manager.import_torchft`, which says which
extra to install where torchft is missing and quiets its log.

Example::

    transport = HealTransport(timedelta(seconds=30))
    manager = torchft.Manager(..., checkpoint_transport=transport)
    transport.last_heal   # a Heal after the group healed, else None
"""

from __future__ import annotations

import time
import urllib.request
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import torch

from ddpkit._compat.serialization import streaming_load
from ddpkit._compat.torchft import heal_transport_base
from ddpkit._core.system import route_to
from ddpkit.runtime.tensortree import map_tensors, tensor_bytes


@dataclass(frozen=True)
class Heal:
    """What one heal received: from which peer, over which route, how much, how long.

    Example:
        >>> print(Heal(0, "node2", "10.0.0.1", "eth0", 2**20, 0.5).describe())
        from the group at place 0 of the quorum, on node2, over 10.0.0.1 (eth0): 1.00 MiB in 0.50 s
    """

    peer_rank: int
    peer_host: str
    local_address: str
    interface: str | None
    nbytes: int
    seconds: float

    def describe(self) -> str:
        route = self.local_address + (f" ({self.interface})" if self.interface else "")
        return (f"from the group at place {self.peer_rank} of the quorum, on {self.peer_host}, "
                f"over {route}: {self.nbytes / 2**20:.2f} MiB in {self.seconds:.2f} s")  # fmt: skip


class HealTransport(heal_transport_base()):  # type: ignore[misc]  # torchft's, untyped
    """torchft's HTTP transport, loading a peer's state with ``weights_only=True`` and
    noting each heal (:attr:`last_heal`).

    Example::

        torchft.Manager(..., checkpoint_transport=HealTransport(timedelta(seconds=30)))
    """

    def __init__(self, timeout: timedelta) -> None:
        super().__init__(timeout=timeout, num_chunks=0)  # one request: no pickled spec
        self.last_heal: Heal | None = None

    @classmethod
    def _load_from_address(cls, address: str, timeout: timedelta) -> object:
        with (
            urllib.request.urlopen(address, timeout=timeout.total_seconds()) as stream,
            warnings.catch_warnings(),
        ):
            warnings.filterwarnings("ignore", "The given buffer is not writable")
            state = streaming_load(stream)  # weights_only: never unpickle a peer's data
        # streamed tensors share the received bytes, which are read-only, and an optimizer
        # steps its state in place: each tensor gets memory of its own
        return map_tensors(state, torch.Tensor.clone)

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        start = time.perf_counter()
        state = super().recv_checkpoint(src_rank, metadata, step, timeout)
        peer = urlsplit(metadata).hostname or "?"
        local, interface = route_to(peer)
        seconds = time.perf_counter() - start
        self.last_heal = Heal(src_rank, peer, local, interface, tensor_bytes(state), seconds)
        return state


def serve_lighthouse(
    bind: str, min_groups: int, heartbeat_timeout: float, join_timeout: float
) -> Any:
    """torchft's lighthouse, serving in this process until ``.shutdown()``; ``.address()``
    says where. The timeouts are in seconds (torchft takes milliseconds).

    Example::

        server = serve_lighthouse("127.0.0.1:0", 2, heartbeat_timeout=1.0, join_timeout=1.0)
    """
    from torchft.coordination import LighthouseServer

    join_ms, heartbeat_ms = round(join_timeout * 1000), round(heartbeat_timeout * 1000)
    return LighthouseServer(bind=bind, min_replicas=min_groups, join_timeout_ms=join_ms,
                            heartbeat_timeout_ms=heartbeat_ms)  # fmt: skip
