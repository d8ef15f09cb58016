"""One optimizer update: an accumulation group's backward passes, the guard's verdict, the step.

``accumulate=K`` makes K micro-batches one group: DDP's gradient all-reduce runs only on the
group's last (``no_sync`` before it). Each micro-batch's loss is checked by the step guard
(:mod:`ddpkit.train.guard`), divided by its group's size and backpropagated outside
autocast, scaled under fp16. At the group's last batch the guard gives its verdict (any
rank's NaN/inf loss; a stop request any rank got), then each optimizer is stepped (unscaled
and clipped first when asked) and its gradients zeroed; before that batch, an optimizer step
does nothing. Once the group is over, the grad scaler and the schedulers move on.

Example:
    >>> import torch, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> model = torch.nn.Linear(2, 1)
    >>> updater = ddpkit.TrainLoop({"model": model, "optimizer": torch.optim.SGD(
    ...     model.parameters(), lr=0.1)}).updater
    >>> updater.begin(index=0, total=1, last=True)
    >>> _ = updater.backward(model(torch.ones(1, 2)).sum())  # the loss, detached
    >>> updater.optimizer_step(list(updater.run.optimizers.values()), True, stop_signal=0)
    >>> updater.end_group(), updater.run.step
    ((True, None), 1)
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import torch
from torch import nn

from ddpkit._core.log import logger
from ddpkit.errors import NonFiniteLossError
from ddpkit.train.guard import StepGuard
from ddpkit.train.options import LoopOptions, SchedulerInterval
from ddpkit.train.precision import MixedPrecision
from ddpkit.train.state import RunState

_NOTHING = contextlib.nullcontext()  # it holds no state: one serves every step


class AcrossGroups(Protocol):
    """What a step asks of the replica groups it is averaged across
    (:class:`~ddpkit.ReplicaGroups`); a run without them has :class:`Alone`."""

    def attach(self, run: RunState, model: nn.Module) -> None: ...

    def start(self) -> None: ...

    def loss_weight(self) -> float: ...

    def finish(self, model: nn.Module) -> bool: ...


class Alone:
    """No replica groups: nothing asked before a step, each loss counts 1, every step taken.

    Example:
        >>> Alone().finish(torch.nn.Linear(1, 1))
        True
    """

    def attach(self, run: RunState, model: nn.Module) -> None:
        return None

    def start(self) -> None:
        return None

    def loss_weight(self) -> float:
        return 1.0

    def finish(self, model: nn.Module) -> bool:
        return True


class Updater:
    """A run's accumulation groups, backward passes and optimizer steps.

    Example::

        updater.optimizer_step(list(run.optimizers.values()), collective=True, stop_signal=0)
    """

    def __init__(
        self, run: RunState, precision: MixedPrecision, guard: StepGuard, options: LoopOptions
    ) -> None:
        self.run = run
        self.precision = precision
        self.guard = guard
        self.clip_grad_norm = options.clip_grad_norm
        self.scheduler_interval = options.scheduler_interval
        self.accumulate = options.accumulate
        self.final, self.group = True, 1  # this micro-batch ends its group of ``group``
        self.stepped = False  # an optimizer step was made in the group in progress
        self._stop: str | None = None  # a stop signal any rank got, agreed in this group
        self.groups: AcrossGroups = options.replica_groups or Alone()
        self.groups.attach(run, run.model)
        # Alone asks nothing of a step: three calls a step skipped, each about 3 us in a
        # GPT-2 step's cold caches (benchmarks/loop_parts.py)
        self._across = options.replica_groups is not None
        # whether begin() has anything to decide: else every micro-batch is a group's last
        self.per_batch = self.accumulate > 1 or self._across
        # where the loss is: the run's device. Read once: loss.device makes a torch.device
        # each time, 8 us of a GPT-2 step's cold caches (benchmarks/loop_parity.py's workload)
        self._device_type = precision.device.type
        # fp32 opens no autocast, so torch is not asked whether the backward runs inside one
        # (5 us a step); a user's own autocast around it changes nothing: backward ops run
        # in the dtypes of their forward ops (torch's autocast documentation)
        self._autocasts = precision.precision != "fp32"

    def begin(self, index: int, total: int | None, last: bool) -> None:
        """Micro-batch ``index`` of ``total`` (None: unknown) starts; ``last``: the epoch's
        (the loop calls it where :attr:`per_batch`: else each is its group's last)."""
        accumulate = self.accumulate
        self.final = (index + 1) % accumulate == 0 or last
        first = index - index % accumulate  # the epoch's last group may be short
        self.group = accumulate if total is None else min(accumulate, total - first)
        if index == first and self._across:
            self.groups.start()

    def gradient_sync(self) -> contextlib.AbstractContextManager[Any]:
        """Around a micro-batch's forward and backward: all-reduce only on its group's last."""
        if self.final:
            return _NOTHING
        return self.run.strategy.no_sync(self.run.model)

    def backward(self, loss: torch.Tensor) -> torch.Tensor:
        """Check ``loss`` for NaN/inf (without waiting for it), then backpropagate its share
        of the accumulation group, outside autocast, scaled under fp16; ``loss`` detached
        (once: a torch call of 5-10 us between a backward and the next step's work)."""
        detached = loss.detach()
        self.guard.losses.append(detached)  # checked at the step (a scalar: backward took it)
        weight = self.groups.loss_weight() if self._across else 1.0
        loss = loss * weight if weight != 1.0 else loss
        loss = loss / self.group if self.group > 1 else loss
        device = self._device_type  # leaving autocast costs 2 us a step: only when inside it
        if not self._autocasts or not torch.is_autocast_enabled(device):
            self.precision.backward(loss)
            return detached
        with torch.autocast(device, enabled=False):
            self.precision.backward(loss)
        return detached

    def optimizer_step(
        self, optimizers: list[torch.optim.Optimizer], collective: bool, stop_signal: int
    ) -> None:
        """At a group's last batch: the guard's verdict, then the update of ``optimizers``.
        Without ``collective`` (uneven batches) nothing is exchanged and a stop waits for the
        epoch's end. Before the group's last batch: nothing."""
        if not self.final:
            return
        verdict = self.guard.check(collective, stop_signal)
        if verdict.nonfinite:
            self._skip_nonfinite(verdict.nonfinite, optimizers)  # a step all the same
            taken = True
        else:
            taken = self._step(optimizers)
        self._stop = self._stop or verdict.stop  # a dropped step's stop: the next step's
        self.stepped = taken

    def end_group(self) -> tuple[bool, str | None]:
        """After a micro-batch's body: whether it ended a group that stepped (then the grad
        scaler, the per-step schedulers and the step count move on; not after a step the
        replica groups dropped), and the stop signal any rank got in it."""
        if not (self.final and self.stepped):
            return False, None
        self.stepped = False
        stop, self._stop = self._stop, None
        if self.precision.scaler is not None:  # fp16 only: no call per step otherwise
            self.precision.update()
        if self.scheduler_interval == "step" and self.run.schedulers:
            self.step_schedulers("step")
        self.run.step += 1
        return True, stop

    def step_schedulers(self, interval: SchedulerInterval) -> None:
        """Step every scheduler when ``interval`` is the run's ``scheduler_interval``."""
        if self.scheduler_interval == interval:
            for scheduler in self.run.schedulers.values():
                scheduler.step()

    def zero_grad(self) -> None:
        """Every optimizer's gradients to None."""
        for optimizer in self.run.optimizers.values():
            optimizer.zero_grad(set_to_none=True)

    def _step(self, optimizers: list[torch.optim.Optimizer]) -> bool:
        """The update; False when the replica groups dropped it (on every group alike):
        then nothing moves on, not the step, the schedulers nor the batches dealt, as
        torchft counts committed steps only (a resumed group's step is compared with its
        peers' to choose who heals from whom)."""
        if self._across and not self.groups.finish(self.run.model):
            self.zero_grad()
            return False
        for optimizer in optimizers:
            if self.clip_grad_norm is not None:
                self.precision.unscale(optimizer)  # clip the true gradients, not scaled ones
                # After DDP's all-reduce every rank holds the same averaged gradients, so
                # the local norm is the global one; FSDP's sharded gradients are DTensors,
                # whose norm torch computes over all shards.
                params = [p for group in optimizer.param_groups for p in group["params"]]
                torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm)
            self.precision.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
        return True

    def _skip_nonfinite(
        self, ranks: dict[int, str], optimizers: list[torch.optim.Optimizer]
    ) -> None:
        """Raise (the default), or drop this step's gradients on every rank."""
        run = self.run
        if self.guard.policy == "error":
            raise NonFiniteLossError(step=run.step + 1, epoch=run.epoch + 1, ranks=ranks)
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        run.skipped_steps += 1
        where = ", ".join(f"{value} on rank {rank}" for rank, value in sorted(ranks.items()))
        logger.info(
            f"skipped step {run.step + 1}: loss is {where} ({run.skipped_steps} skipped so far)"
        )
