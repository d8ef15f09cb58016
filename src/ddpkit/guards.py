"""The step guard: one small all-reduce per optimizer step, before the weights change.

Two things need every rank's word before a step: whether any rank's loss was NaN or
infinite (its gradients are then in every rank's all-reduced gradient), and whether any
rank was asked to stop (a preemption signal reaches ranks at slightly different moments,
yet all must stop at the same step). Each rank writes its own slot of a tiny tensor, one
all-reduce (max) combines them, and every rank reaches the same verdict:

- a non-finite loss stops training with :class:`~ddpkit.errors.NonFiniteLossError` naming
  the step and the ranks (``nonfinite_loss="error"``, the default), before any rank updates
  its weights; or every rank skips that update (``"skip"``);
- a stop request makes every rank checkpoint at that step and exit (:mod:`ddpkit.preemption`).

The loss is checked on the device, so nothing waits for it until the guard's own exchange.
When ranks have different numbers of batches (torch's ``Join``), a collective inside the loop
would hang the ranks that finished: the guard then checks each rank's loss alone, and stop
requests wait for the end of the epoch.

Example:
    >>> import torch, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> guard = StepGuard("error")
    >>> guard.note_loss(torch.tensor(float("nan")))
    >>> guard.check(collective=True).nonfinite
    {0: 'nan'}
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

import torch

from ddpkit.collectives import all_reduce_max
from ddpkit.rendezvous import current_world
from ddpkit.validate import check_choice

NONFINITE_POLICIES = ("error", "skip")
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
    """Collects this rank's loss checks between steps; :meth:`check` exchanges them.

    Example:
        >>> StepGuard("skip").policy
        'skip'
    """

    def __init__(self, policy: str) -> None:
        check_choice("nonfinite_loss", policy, NONFINITE_POLICIES)
        self.policy = policy
        self._worst: torch.Tensor | None = None  # 0 finite, 1 nan, 2 inf; max over micro-batches

    def note_loss(self, loss: torch.Tensor) -> None:
        """Remember whether ``loss`` (one micro-batch's) is finite, without waiting for it."""
        value = loss.detach()
        code = torch.where(value.isnan(), 1.0, torch.where(value.isinf(), 2.0, 0.0)).max()
        self._worst = code if self._worst is None else torch.maximum(self._worst, code)

    def check(self, collective: bool, stop_signal: int = 0) -> Verdict:
        """The verdict for the step about to be taken; with ``collective`` all ranks agree.

        ``stop_signal`` is the number of the signal this rank was asked to stop by (0: none).
        """
        world = current_world()
        flags = torch.zeros(world.world_size + 1, device=world.device)
        if self._worst is not None:
            flags[world.rank] = self._worst
        flags[-1] = float(stop_signal)
        self._worst = None
        values = (all_reduce_max(flags) if collective else flags).tolist()
        nonfinite = {rank: _CODES[v] for rank, v in enumerate(values[:-1]) if v in _CODES}
        return Verdict(nonfinite=nonfinite, stop=_signal_name(values[-1]))

    def any_stop(self, stop_signal: int) -> str | None:
        """The stop signal any rank got, or None (a collective; at the end of an epoch).

        Example:
            >>> StepGuard("error").any_stop(0) is None
            True
        """
        return _signal_name(all_reduce_max(float(stop_signal)))


def _signal_name(number: float) -> str | None:
    return signal.Signals(int(number)).name if number > 0 else None
