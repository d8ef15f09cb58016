"""The step guard: before each optimizer step, what every rank must agree on.

- **Stop requests.** A preemption signal reaches ranks at slightly different moments, yet
  all must stop at the same step (:mod:`ddpkit.train.stop`). The ranks all-reduce their
  flags at step boundaries on a schedule they agree on (each exchange carries rank 0's
  choice of how many boundaries until the next, from its step time): about once every
  :data:`EXCHANGE_EVERY_S` seconds, for about a millisecond each on gloo.
- **Non-finite losses.** ``nonfinite_loss="error"`` (the default): a rank whose loss was
  NaN or infinite raises :class:`~ddpkit.errors.NonFiniteLossError` naming the step and
  itself before its optimizer step (its peers cannot save the poisoned gradients: every
  checkpoint starts with a collective the failed rank never joins). ``"skip"``: every rank
  skips the same step, so the checks are exchanged before every update.

**Uneven shares.** ``prepare_loader`` evens the shards out (its loader says so, as a
stream's and ``ReplicaBatches`` do: ``ranks_in_step``), but a loader of your own may not.
:func:`uneven_shares` finds out once per epoch, for a loader that does not say so. Under
DDP the ranks that run out first would leave the others waiting in a gradient all-reduce
forever, so such an epoch runs under torch's ``Join``, whose finished ranks keep answering
(:func:`join_unless`); nothing else collective may run between its batches, so the stop
exchange, step checkpoints and replica checks wait for the epoch's end. FSDP's all-gathers
cannot be joined, and ``"skip"`` needs every rank to agree at each step: both are refused
naming the ranks' batch counts.

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

import contextlib
import math
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ddpkit._core.log import logger
from ddpkit.errors import ConfigError
from ddpkit.parallel.strategy import strategy_of
from ddpkit.runtime.collectives import all_reduce_max
from ddpkit.runtime.session import current_world
from ddpkit.train.options import NonFiniteLoss

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

    ``exchange_stops`` turns on the stop-request exchange (the loop does when it has a
    ``checkpoint_dir`` to save into). Every rank must call :meth:`check` at each optimizer
    step and :meth:`epoch_end` at each epoch's end, as collectives are.

    Example:
        >>> StepGuard("skip", exchange_stops=False).policy
        'skip'
    """

    def __init__(self, policy: NonFiniteLoss, exchange_stops: bool) -> None:
        self.policy = policy
        self.exchange_stops = exchange_stops
        # This step's losses as backward got them (one-element tensors, detached): the loop
        # appends to the list itself, no call of ours a batch; summed at the check
        self.losses: list[torch.Tensor] = []
        self._waited = 0  # step boundaries since the last exchange
        self._due = 1  # ... when the next exchange is due (the first calibrates)
        self._last_exchange = time.monotonic()
        self._skipped_in_loop = False  # an uneven epoch: no exchange inside it

    def note_loss(self, loss: torch.Tensor) -> None:
        """Add one micro-batch's loss (any shape: its sum), without waiting for it."""
        value = loss.detach()
        self.losses.append(value if value.numel() == 1 else value.float().sum())

    def check(self, collective: bool, stop_signal: int = 0) -> Verdict:
        """The verdict for the step about to be taken.

        ``stop_signal`` is the number of the signal this rank was asked to stop by (0:
        none). Without ``collective`` (uneven batches) nothing is exchanged.
        """
        losses = self.losses
        # a Python float's sum: NaN/inf stay, and finite losses cannot overflow to inf
        value = losses[0].item() if len(losses) == 1 else sum(loss.item() for loss in losses)
        losses.clear()
        code = 0.0 if value - value == 0.0 else _code(value)  # finite (most steps): no call
        if not collective:
            self._skipped_in_loop = True
            return self._own_verdict(code)
        if self._is_due() or self.policy == "skip":  # counts the step, whatever the policy
            return self._exchange(code, stop_signal)
        return self._own_verdict(code) if code else _CLEAR

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

    @staticmethod
    def _own_verdict(code: float) -> Verdict:
        """This rank's losses alone: the shared all-clear when finite (most steps)."""
        return Verdict(nonfinite=_nonfinite({current_world().rank: code})) if code else _CLEAR

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


_CLEAR = Verdict()  # no rank's loss is NaN/inf and no stop was asked for (read, never changed)


def _code(loss_sum: float) -> float:
    return 1.0 if math.isnan(loss_sum) else 2.0 if math.isinf(loss_sum) else 0.0


def _nonfinite(codes: dict[int, float]) -> dict[int, str]:
    return {rank: _CODES[code] for rank, code in codes.items() if code in _CODES}


def _signal_name(number: float) -> str | None:
    return signal.Signals(int(number)).name if number > 0 else None


def uneven_shares(model: nn.Module, total: int | None, nonfinite_loss: NonFiniteLoss) -> str | None:
    """How the ranks' batch counts differ (one collective), or None when every rank has
    ``total`` too (None for a loader without a length); refuses what cannot work.

    Example:
        >>> import ddpkit
        >>> _ = ddpkit.init()
        ddpkit: world size 1 ...
        >>> uneven_shares(torch.nn.Linear(1, 1), total=3, nonfinite_loss="error") is None
        True
        >>> ddpkit.shutdown()
    """
    if current_world().world_size == 1:
        return None
    count = float(total if total is not None else -1)
    # One collective for both ends: the max of -count is minus the min.
    most, negated_fewest = all_reduce_max(torch.tensor([count, -count])).tolist()
    fewest = -negated_fewest
    if most == fewest and fewest >= 0:
        return None
    spread = _spread_text(int(fewest), int(most))
    strategy = strategy_of(model)
    if strategy.uneven_batches == "refuse":
        raise ConfigError(
            f"{strategy.name.upper()} needs the same number of batches on every rank, but "
            f"{spread}; shard with ddpkit.prepare_loader (uneven='pad' or 'drop'), or use "
            "strategy='ddp'"
        )
    if nonfinite_loss == "skip":
        raise ConfigError(
            f"nonfinite_loss='skip' needs every rank to skip the same steps, but {spread}; "
            "shard with ddpkit.prepare_loader, or use nonfinite_loss='error'"
        )
    return spread


def _spread_text(fewest: int, most: int) -> str:
    """What the ranks' batch counts say; -1 stands for a loader without a length."""
    if most < 0:
        return ("the loader has no length (an IterableDataset), so no rank knows how many "
                "batches the others have")  # fmt: skip
    if fewest < 0:
        return f"some ranks' loaders have no length, others up to {most} batches"
    return f"ranks have between {fewest} and {most} batches"


def join_unless(even: bool, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
    """torch's ``Join`` around an epoch whose ranks hold different numbers of batches.

    Example:
        >>> join_unless(True, torch.nn.Linear(1, 1))  # doctest: +ELLIPSIS
        <contextlib.nullcontext object at ...>
    """
    if even:  # most epochs: the ranks meet at every batch, nothing to join
        return contextlib.nullcontext()
    strategy = strategy_of(model)
    if strategy.uneven_batches == "join":
        return strategy.join(model)
    return contextlib.nullcontext()  # no collectives inside the loop: nothing can hang


def even_epoch(
    model: nn.Module, in_step: bool, total: int | None, nonfinite_loss: NonFiniteLoss, epoch: int,
    was_even: bool,
) -> bool:  # fmt: skip
    """Whether every rank has as many batches in ``epoch`` (from 0), said when an epoch turns
    uneven (``was_even``), not every epoch. A loader that keeps the ranks in step itself
    (``in_step``: a stream's, ReplicaBatches) is even.

    Example::

        even = even_epoch(model, facts.ranks_in_step, len(loader), "error", 0, was_even=True)
    """
    spread = None if in_step else uneven_shares(model, total, nonfinite_loss)
    if spread and was_even:
        logger.info(
            f"epoch {epoch + 1}: {spread}; the epoch runs under torch's Join and stop "
            "requests, step checkpoints and replica checks wait for its end"
        )
    return spread is None
