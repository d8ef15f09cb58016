"""The step guard: before each optimizer step, what every rank must agree on.

- **Stop requests.** A preemption signal reaches ranks at slightly different moments, yet
  all must stop at the same step (:mod:`ddpkit.train.preemption`). The ranks all-reduce their
  flags at step boundaries on a schedule they agree on: each exchange also carries rank 0's
  choice of how many step boundaries to wait until the next one, from its measured step
  time, so that exchanges come about once every :data:`EXCHANGE_EVERY_S` seconds. Every
  rank learns of a signal at the same step, within about a second, and the job pays about
  one millisecond per second for it (an all-reduce of a few floats over gloo on a busy
  machine costs that much, however small).
- **Non-finite losses.** ``nonfinite_loss="error"`` (the default): a rank whose loss was
  NaN or infinite raises :class:`~ddpkit.errors.NonFiniteLossError` naming the step and
  itself before its optimizer step. Its peers cannot save the poisoned gradients they
  received, because every checkpoint starts with a collective the failed rank never joins,
  and the launcher stops them. ``"skip"``: every rank must skip the same step, so the ranks
  exchange their checks before every update (one small all-reduce per step).

When ranks have different numbers of batches (torch's ``Join``), a collective inside the loop
would hang the ranks that finished, and their step counts differ: the exchange then waits
for the end of the epoch, and ``"skip"`` is refused (see :mod:`ddpkit.train.uneven`).

Example:
    >>> import torch, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> guard = StepGuard("error", exchange_stops=True)
    >>> guard.note_loss(torch.tensor(float("nan")))
    >>> guard.check(collective=True).nonfinite
    {0: 'nan'}
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

from ddpkit._core.validate import check_choice
from ddpkit.runtime.collectives import all_reduce_max
from ddpkit.runtime.session import current_world

NonFiniteLoss = Literal["error", "skip"]
NONFINITE_POLICIES: tuple[NonFiniteLoss, ...] = get_args(NonFiniteLoss)
EXCHANGE_EVERY_S = 1.0  # how often ranks compare stop requests
_MOST_BOUNDARIES = 100_000  # between two exchanges, however fast the steps
_CODES = {1.0: "nan", 2.0: "inf"}


@dataclass(frozen=True)
class Verdict:
    """What every rank agreed on for one step.

    Example:
        >>> Verdict(nonfinite={1: "inf"}).nonfinite
        {1: 'inf'}
    """

    nonfinite: dict[int, str] = field(default_factory=dict)  # rank -> "nan" | "inf"
    stop: str | None = None  # the signal a rank was asked to stop by, e.g. "SIGTERM"


class StepGuard:
    """Checks this rank's losses; agrees with the other ranks on stops (and on skips).

    ``exchange_stops`` turns on the stop-request exchange (the Trainer does when it has a
    ``checkpoint_dir`` to save into). Every rank must call :meth:`check` at each optimizer
    step and :meth:`epoch_end` at each epoch's end, as collectives are.

    Example:
        >>> StepGuard("skip", exchange_stops=False).policy
        'skip'
    """

    def __init__(self, policy: NonFiniteLoss, exchange_stops: bool) -> None:
        check_choice("nonfinite_loss", policy, NONFINITE_POLICIES)
        self.policy = policy
        self.exchange_stops = exchange_stops
        self._losses: torch.Tensor | None = None  # sum of this step's losses: NaN/inf stay
        self._waited = 0  # step boundaries since the last exchange
        self._due = 1  # ... when the next exchange is due (the first calibrates)
        self._last_exchange = time.monotonic()
        self._skipped_in_loop = False  # an uneven epoch: no exchange inside it

    def note_loss(self, loss: torch.Tensor) -> None:
        """Add one micro-batch's loss, without waiting for it."""
        value = loss.detach().float().sum()
        self._losses = value if self._losses is None else self._losses + value

    def check(self, collective: bool, stop_signal: int = 0) -> Verdict:
        """The verdict for the step about to be taken.

        ``stop_signal`` is the number of the signal this rank was asked to stop by (0:
        none). Without ``collective`` (uneven batches) nothing is exchanged.
        """
        code = _code(float(self._losses.item())) if self._losses is not None else 0.0
        self._losses = None
        if not collective:
            self._skipped_in_loop = True
            return Verdict(nonfinite=_nonfinite({current_world().rank: code}))
        if self.policy == "skip" or self._is_due():
            return self._exchange(code, stop_signal)
        return Verdict(nonfinite=_nonfinite({current_world().rank: code}))

    def epoch_end(self, stop_signal: int) -> str | None:
        """At an epoch's end: the stop signal any rank got, when an exchange is due.

        Example:
            >>> StepGuard("error", exchange_stops=False).epoch_end(signal.SIGTERM) is None
            True
        """
        forced, self._skipped_in_loop = self._skipped_in_loop, False
        if not self.exchange_stops or not (forced or self._is_due()):
            return None
        return self._exchange(0.0, stop_signal).stop

    def _is_due(self) -> bool:
        self._waited += 1
        return self.exchange_stops and self._waited >= self._due

    def _exchange(self, code: float, stop_signal: int) -> Verdict:
        """One all-reduce (max): each rank's loss code, the stop signal, rank 0's schedule."""
        world = current_world()
        flags = torch.zeros(world.world_size + 2)
        flags[world.rank] = code
        flags[-2] = float(stop_signal)
        if world.rank == 0:
            flags[-1] = self._next_interval()
        values = all_reduce_max(flags).tolist()
        self._due, self._waited = max(1, int(values[-1])), 0
        self._last_exchange = time.monotonic()
        codes = dict(enumerate(values[: world.world_size]))
        return Verdict(nonfinite=_nonfinite(codes), stop=_signal_name(values[-2]))

    def _next_interval(self) -> float:
        """Step boundaries until the next exchange: about EXCHANGE_EVERY_S at this pace."""
        per_boundary = (time.monotonic() - self._last_exchange) / max(1, self._waited)
        return float(min(_MOST_BOUNDARIES, max(1, int(EXCHANGE_EVERY_S / max(per_boundary, 1e-9)))))


def _code(loss_sum: float) -> float:
    return 1.0 if math.isnan(loss_sum) else 2.0 if math.isinf(loss_sum) else 0.0


def _nonfinite(codes: dict[int, float]) -> dict[int, str]:
    return {rank: _CODES[code] for rank, code in codes.items() if code in _CODES}


def _signal_name(number: float) -> str | None:
    return signal.Signals(int(number)).name if number > 0 else None
