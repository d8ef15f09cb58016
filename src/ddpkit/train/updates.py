"""How the Trainer updates the models: backward, the guard's verdict, optimizer and scheduler
steps, for the Trainer's own steps and for a ``training_step`` that makes its own.

After each step's last batch the Trainer asks the step guard (:mod:`ddpkit.train.guards`)
whether any rank's loss was NaN or infinite and whether a rank was asked to stop, then steps
every optimizer (clipping and unscaling first as configured) and the schedulers. A step that
updates its models itself (a GAN's two updates) calls :meth:`Updates.backward` and
:meth:`Updates.optimizer_step` instead, and gets the same checks for each update.

Example:
    >>> import torch
    >>> model = torch.nn.Linear(1, 1)
    >>> Updates(model, torch.optim.SGD(model.parameters(), lr=1), None, None).step
    0
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from ddpkit._core.log import logger
from ddpkit._core.validate import SchedulerInterval
from ddpkit.errors import ConfigError, NonFiniteLossError
from ddpkit.train.checkpointed import TrainerState
from ddpkit.train.monitor import backward_label
from ddpkit.train.preemption import StopSignals

if TYPE_CHECKING:
    from ddpkit.train.guards import StepGuard
    from ddpkit.train.monitor import StepMonitor
    from ddpkit.train.resume import Checkpointer


class Updates(TrainerState):
    """The update half of the Trainer (see the module docstring).

    Example::

        trainer.backward(loss_d); trainer.optimizer_step(trainer.optimizers["D"])
    """

    accumulate: int = 1
    clip_grad_norm: float | None = None
    scheduler_interval: SchedulerInterval = "step"
    _guard: StepGuard
    _monitor: StepMonitor
    _signals: StopSignals | None = None
    checkpoints: Checkpointer | None
    _even = True  # every rank has as many batches this epoch
    _manual = False  # the running step calls backward/optimizer_step itself
    _pending_stop: str | None = None  # a stop agreed during a manual step

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` for a step that updates its models itself (manual mode).

        Checks the loss for NaN/inf with the step guard, scales it under fp16, and tells
        the hang watchdog; use it instead of ``loss.backward()`` inside ``training_step``.

        Example::

            def training_step(self, batch):
                loss_d = ...
                self.backward(loss_d)
                self.optimizer_step(self.optimizers["D"])
        """
        if self.accumulate > 1:
            raise ConfigError(
                "accumulate > 1 needs the Trainer's own backward and optimizer steps; a "
                "training_step that calls trainer.backward() accumulates by itself"
            )
        self._manual = True
        self._guard.note_loss(loss)
        self._monitor.phase(backward_label(True, self.world.world_size))
        with torch.autocast(self.world.device.type, enabled=False):  # backward outside autocast
            self.precision.backward(loss)

    def optimizer_step(self, *optimizers: torch.optim.Optimizer) -> None:
        """Step ``optimizers`` (default: all of them) after the guard's verdict, then zero
        their gradients: what the Trainer does after each batch, for a step that updates
        its models itself. Every rank must call it as often as the others (it may exchange
        flags with them).

        Example::

            self.optimizer_step(self.optimizers["G"])
        """
        chosen = list(optimizers) or list(self.optimizers.values())
        stop = self._guarded_update(self._even, chosen)
        self._pending_stop = self._pending_stop or stop
        self._manual = True

    def _gradient_sync(self, final: bool) -> contextlib.AbstractContextManager[Any]:
        """All-reduce gradients only on the last micro-step of an accumulation group."""
        if final:
            return contextlib.nullcontext()
        return self.strategy.no_sync(self.model)

    def _finish_step(self) -> str | None:
        """After a step's last batch: update (unless the step did), schedulers, watchers.

        Returns the stop signal all ranks agreed on. Without a collective exchange (uneven
        batches under Join) a stop waits for the epoch's end.
        """
        if self._manual:
            stop, self._pending_stop = self._pending_stop, None
        else:
            stop = self._guarded_update(self._even, list(self.optimizers.values()))
        self.precision.update()
        self._step_schedulers("step")
        self.step += 1
        self._monitor.next_step(self.step + 1)
        self._monitor.step_done(self.model, self.step)
        return stop

    def _guarded_update(
        self, collective: bool, optimizers: list[torch.optim.Optimizer]
    ) -> str | None:
        """The guard's verdict, then the update of ``optimizers``; returns the agreed stop."""
        self._monitor.phase("optimizer step")
        verdict = self._guard.check(collective, self._stop_signal())
        if verdict.nonfinite:
            self._skip_nonfinite(verdict.nonfinite, optimizers)
        else:
            self._update_weights(optimizers)
        return verdict.stop

    def _update_weights(self, optimizers: list[torch.optim.Optimizer]) -> None:
        for optimizer in optimizers:
            if self.clip_grad_norm is not None:
                self.precision.unscale(optimizer)  # clip the true gradients, not scaled ones
                # After DDP's all-reduce every rank holds the same averaged gradients, so
                # the local norm is the global one; FSDP's sharded gradients are DTensors,
                # whose norm torch computes over all shards.
                params = [p for group in optimizer.param_groups for p in group["params"]]
                torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm)
            self.precision.step(optimizer, update=False)
            optimizer.zero_grad(set_to_none=True)

    def _skip_nonfinite(
        self, ranks: dict[int, str], optimizers: list[torch.optim.Optimizer]
    ) -> None:
        """Raise (the default), or drop this step's gradients on every rank."""
        if self._guard.policy == "error":
            raise NonFiniteLossError(step=self.step + 1, epoch=self.epoch + 1, ranks=ranks)
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        self.skipped_steps += 1
        where = ", ".join(f"{value} on rank {rank}" for rank, value in sorted(ranks.items()))
        logger.info(f"skipped step {self.step + 1}: loss is {where} ({self.skipped_steps} "
               "skipped so far)")  # fmt: skip

    def _step_schedulers(self, interval: SchedulerInterval) -> None:
        if self.scheduler_interval == interval:
            for scheduler in self.schedulers.values():
                scheduler.step()

    def _zero_grad(self) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=True)

    @contextlib.contextmanager
    def _catching_stop_signals(self) -> Iterator[None]:
        """SIGTERM / SIGUSR1 become stop requests, when there is somewhere to save to."""
        if self.checkpoints is None:
            yield
            return
        with StopSignals() as signals:
            self._signals = signals
            try:
                yield
            finally:
                self._signals = None

    def _stop_signal(self) -> int:
        return self._signals.signum if self._signals is not None else 0
