"""How far each rank's wall clock is from rank 0's, measured through the job's store.

Traces carry each host's wall clock; hosts' clocks differ by milliseconds (more without
NTP), so a merged timeline would show a collective ending on one rank before it began on
another. Each rank asks rank 0 for its time a few rounds in a row, through the store (the
channel every job already has), NTP's way: the offset is the rank's midpoint between asking
and hearing back, less rank 0's answer; the round with the shortest round trip is kept (its
error is at most half that round trip, well under a millisecond on one network).

``DDPKIT_TEST_CLOCK_SKEW_MS`` moves this process's wall clock (and so its trace) forward,
for the tests that check the offset is found and corrected.

Example:
    >>> offsets = ClockSamples()
    >>> offsets.add(sent_ns=1_000, answer_ns=5_600, heard_ns=1_400)  # rank 0 at 5_600
    >>> offsets.add(sent_ns=2_000, answer_ns=6_100, heard_ns=2_100)
    >>> offsets.best()  # the 100 ns round: this clock is 4050 ns behind rank 0's
    -4050
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from torch.distributed import Store

from ddpkit._core.protocol import CLOCK_SKEW_ENV

ROUNDS = 8


def skew_ns() -> int:
    """The test skew of this process's clock, in ns (0 unless ``DDPKIT_TEST_CLOCK_SKEW_MS``)."""
    raw = os.environ.get(CLOCK_SKEW_ENV, "")
    return int(float(raw) * 1_000_000) if raw else 0


def wall_ns() -> int:
    """This process's wall clock in ns since the epoch (the clock traces are written in)."""
    return time.time_ns() + skew_ns()


@dataclass
class ClockSamples:
    """Rounds of asking rank 0 the time: (round trip, offset) each, in ns."""

    rounds: list[tuple[int, int]] = field(default_factory=list)

    def add(self, sent_ns: int, answer_ns: int, heard_ns: int) -> None:
        midpoint = (sent_ns + heard_ns) // 2
        self.rounds.append((heard_ns - sent_ns, midpoint - answer_ns))

    def best(self) -> int:
        """The offset of the round with the shortest round trip (0 without rounds)."""
        return min(self.rounds)[1] if self.rounds else 0


def measure_offset(store: Store | None, rank: int, ranks: list[int], prefix: str) -> int:
    """This rank's clock minus rank 0's, in ns; every rank in ``ranks`` calls it at once,
    and rank 0 answers the others (rank 0 and a job without a store: 0).

    Example:
        >>> measure_offset(None, 0, [0], "p")
        0
    """
    if store is None or len(ranks) < 2:
        return 0
    if rank == 0:
        _answer(store, [r for r in ranks if r != 0], prefix)
        return 0
    if rank not in ranks:
        return 0
    return _ask(store, rank, prefix).best()


def _ask(store: Store, rank: int, prefix: str) -> ClockSamples:
    samples = ClockSamples()
    for round_ in range(ROUNDS):
        key = f"{prefix}/clock/{rank}/{round_}"
        sent = wall_ns()
        store.set(f"{key}/ask", "")
        answer = int(bytes(store.get(f"{key}/time")).decode())  # waits for rank 0's answer
        samples.add(sent, answer, wall_ns())
        _forget(store, f"{key}/ask", f"{key}/time")
    return samples


def _answer(store: Store, others: list[int], prefix: str) -> None:
    for rank in others:
        for round_ in range(ROUNDS):
            key = f"{prefix}/clock/{rank}/{round_}"
            store.wait([f"{key}/ask"])
            store.set(f"{key}/time", str(wall_ns()))


def _forget(store: Store, *keys: str) -> None:
    for key in keys:
        try:
            store.delete_key(key)
        except (RuntimeError, NotImplementedError):  # a store without deletes keeps them
            return
