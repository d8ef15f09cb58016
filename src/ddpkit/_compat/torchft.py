"""What ddpkit reaches for inside torchft (0.2): the manager's quorum client, and the HTTP
transport's loader of a healing peer's state.

Example::

    renumber_quorums(manager, QuorumNumbers().renumber)   # unique across restarts
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddpkit._compat import Internal
from ddpkit.errors import ConfigError

QUORUM_CLIENT = Internal(
    "torchft.Manager._client._quorum", "torchft",
    "quorum numbers are torchft's own: after a lighthouse restart a number may come back, and "
    "the groups may then meet under an old one's store prefix (connection refused, a stall)",
)  # fmt: skip
HEAL_LOADER = Internal(
    "torchft.checkpointing.http_transport.HTTPTransport._load_from_address", "torchft",
    "a healing group could not load its peer's state with weights_only=True, so ddpkit "
    "refuses to heal",
)  # fmt: skip


def renumber_quorums(manager: Any, renumber: Callable[[int, list[str], int], int]) -> bool:
    """Give each quorum ``manager`` receives the number ``renumber(number, members, step)``
    (the lighthouse's number, the replica ids, the step it was formed at); whether it could.

    Example::

        renumber_quorums(manager, QuorumNumbers().renumber)
    """
    QUORUM_CLIENT.used()
    client = getattr(manager, "_client", None)
    if client is None or not hasattr(client, "_quorum"):
        QUORUM_CLIENT.gone()
        return False
    manager._client = _RenumberingClient(client, renumber)
    return True


class _RenumberingClient:
    """torchft's manager client, each call passed through, each quorum renumbered."""

    def __init__(self, client: Any, renumber: Callable[[int, list[str], int], int]) -> None:
        self._inner, self._renumber = client, renumber

    def __getattr__(self, name: str) -> Any:  # everything but the quorum, as torchft's
        return getattr(self._inner, name)

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        quorum = self._inner._quorum(*args, **kwargs)
        number = self._renumber(quorum.quorum_id, list(quorum.replica_ids), quorum.max_step)
        return _Renumbered(quorum, number)


class _Renumbered:
    """A quorum answer with another number; every other field as torchft gave it."""

    def __init__(self, quorum: Any, number: int) -> None:
        self._answer, self.quorum_id = quorum, number

    def __getattr__(self, name: str) -> Any:
        return getattr(self._answer, name)


def heal_transport_base() -> type:
    """torchft's HTTP transport, checked to load a peer's state through the method ddpkit
    overrides (:class:`ddpkit.faulttolerance.heal.HealTransport`); a ConfigError otherwise.

    Example::

        class HealTransport(heal_transport_base()): ...
    """
    HEAL_LOADER.used()
    from torchft.checkpointing.http_transport import HTTPTransport

    if not callable(getattr(HTTPTransport, "_load_from_address", None)):
        HEAL_LOADER.gone()
        raise ConfigError(
            f"{HEAL_LOADER.where} is gone in this torchft: {HEAL_LOADER.without}; install the "
            "torchft ddpkit was checked with (pip install 'ddpkit[ft]')"
        )
    base: type = HTTPTransport
    return base
