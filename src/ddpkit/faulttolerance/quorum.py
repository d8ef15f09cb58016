"""**Experimental.** torchft's quorum numbers made unique across a lighthouse's restarts.

torchft (0.2) names each quorum's process group by the lighthouse's quorum number: the
groups meet in their store under ``torchft/<number>/`` and a group builds a new process
group only when the number changes. A restarted lighthouse counts again from the start, so
after an outage a number comes back: a group that was already at that number keeps its old
process group while the others build a new one, or they read the addresses an earlier
quorum left under that prefix and connect to ports nobody listens on any more (seen in CI:
``Connection refused``, then the surviving group stuck in gloo's connect until its timeout).

:class:`QuorumNumbers` renumbers each quorum torchft's manager receives (through
:func:`ddpkit._compat.torchft.renumber_quorums`) by what every member of it knows alike:
the lighthouse's number, its members and the step it was formed at. A quorum that goes on
keeps its number; a new one, after a restart too, gets a number no earlier quorum had.

Example:
    >>> numbers = QuorumNumbers()
    >>> first = numbers.renumber(1, ["g0:a", "g1:b"], step=3)
    >>> numbers.renumber(1, ["g1:b", "g0:a"], step=9) == first    # the same quorum, on
    True
    >>> numbers.renumber(1, ["g0:a"], step=12) == first            # a new one, same number
    False
"""

from __future__ import annotations

from typing import Any

from ddpkit._compat.torchft import renumber_quorums
from ddpkit._core.text import short_digest


class QuorumNumbers:
    """The numbers given to one manager's quorums: the same while a quorum goes on, a new
    one for each new quorum, a restarted lighthouse's included.

    Example::

        renumber_quorums(manager, QuorumNumbers().renumber)   # see install()
    """

    def __init__(self) -> None:
        self._last: tuple[int, tuple[str, ...]] | None = None
        self._number = 0

    def renumber(self, lighthouse_number: int, members: list[str], step: int) -> int:
        """The number for a quorum the lighthouse numbered ``lighthouse_number``; members
        and step are the same in every member's answer of the round that formed it."""
        seen = (lighthouse_number, tuple(sorted(members)))
        if seen != self._last:
            text = f"{lighthouse_number} {step} {' '.join(seen[1])}"
            self._number = int(short_digest(text, 15), 16)
            self._last = seen
        return self._number


def install(manager: Any) -> bool:
    """Renumber ``manager``'s quorums; whether it could (a torchft whose manager has no
    quorum client as 0.2 has keeps its own numbers, said once).

    Example::

        install(torchft.Manager(...))
    """
    return renumber_quorums(manager, QuorumNumbers().renumber)
