"""What watches the loop's steps: the hang watchdog's position, the replica check, the step limit.

The loop writes where it is (loading a batch, forward, backward, the optimizer step) into
the monitor's ``position`` (attribute writes, no call: :mod:`ddpkit.runtime.position`) and
tells the monitor when a step is done, which the watchers need:

- the hang watchdog times each micro-batch, from loading it to the optimizer step, reading
  the position when it looks;
- ``check_replicas_every=M`` (or ``DDPKIT_CHECK_REPLICAS_EVERY``, which strategies without
  identical replicas ignore) compares the replicas every M optimizer steps; a divergence is
  passed to the callbacks' ``on_replicas_checked`` and raises
  :class:`~ddpkit.errors.ReplicaDivergenceError` unless one reports it itself (verify does);
- ``DDPKIT_MAX_STEPS=K`` (set by ``ddpkit verify`` and ``ddpkit doctor --run``) makes the
  K-th step's end a :class:`~ddpkit.train.stop.Stop` with exit code 0.

Example:
    >>> monitor = StepMonitor(nn.Linear(2, 2), None, Events())
    >>> monitor.stage(LOADING)
    >>> monitor.position.label()
    'step 0: loading the batch'
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import Any

from torch import nn

from ddpkit._core.envvars import positive_int_var
from ddpkit._core.protocol import CHECK_REPLICAS_ENV, MAX_STEPS_ENV
from ddpkit.observe.steptime import Phase, StepClock
from ddpkit.parallel.replicas import check_replicable, check_replicas
from ddpkit.parallel.strategy import strategy_of
from ddpkit.runtime.callbacks import Events
from ddpkit.runtime.position import LOADING, Stage, TrainingPosition, backward_stage
from ddpkit.runtime.session import world_or_none
from ddpkit.runtime.watchdog import current_watchdog
from ddpkit.train.stop import Stop, StopKind


class StepMonitor:
    """The loop's watchers, configured once per run.

    Example:
        >>> import torch, ddpkit
        >>> _ = ddpkit.init(hang_timeout=0)
        ddpkit: world size 1 ...
        >>> monitor = StepMonitor(nn.Linear(2, 2), None, Events())
        >>> [b for b in monitor.batches([1, 2])]
        [1, 2]
        >>> ddpkit.shutdown()
    """

    def __init__(self, model: nn.Module, check_replicas_every: int | None, events: Events) -> None:
        self.watchdog = current_watchdog()
        if check_replicas_every:
            check_replicable(model)  # asked for by name: refuse what cannot be checked
        replicated = strategy_of(model).replicas_identical
        from_env = positive_int_var(CHECK_REPLICAS_ENV) if replicated else None
        self.check_every = check_replicas_every or from_env
        self.max_steps = positive_int_var(MAX_STEPS_ENV)
        self.watches_steps = bool(self.check_every or self.max_steps)  # else no call a step
        self._events = events
        # The running watchdog's (it reads it when it looks); without one, read by no one
        watchdog = self.watchdog
        self.position = watchdog.position if watchdog is not None else TrainingPosition()
        world = world_or_none()  # labels only: a monitor made outside a run has a world of 1
        size = world.world_size if world is not None else 1
        # by the group's final batch (whether the backward all-reduces): the loop picks one
        self.backward_stages = (backward_stage(False, size), backward_stage(True, size))

    def batches(
        self, loader: Iterable[Any], evaluation: bool = False, clock: StepClock | None = None
    ) -> Iterator[Any]:
        """The loader's batches, each in the position from the moment it is requested (the
        last one is ended by :meth:`ending`), and timed by ``clock`` as data. One generator
        for both: each layer between the loader and the loop is a resumption per batch."""
        iterator, position, now = iter(loader), self.position, time.monotonic
        while True:
            # The watchdog times the batch from here; a torn read of these is off by a stage
            position.since, position.stage, position.evaluating = now(), LOADING, evaluation
            position.batches += 1
            if clock is not None:
                clock.enter(Phase.DATA)
            try:
                batch = next(iterator)
            except StopIteration:
                if clock is not None:
                    clock.enter(Phase.OTHER)
                position.idle()
                return
            yield batch

    def next_step(self, step: int) -> None:
        """The optimizer step number the next batch belongs to."""
        self.position.step = step

    def stage(self, stage: Stage) -> None:
        """The current batch entered ``stage`` (the loop writes its own stages inline)."""
        self.position.stage = stage

    def batch_done(self) -> None:
        """The current batch is finished (its optimizer step too, if it had one)."""
        self.position.idle()

    @contextlib.contextmanager
    def ending(self) -> Iterator[None]:
        """Around a loop over :meth:`batches`: its last batch is ended however the loop ends
        (a generator left by an exception is not finalized at once)."""
        try:
            yield
        finally:
            self.batch_done()

    def step_done(self, model: nn.Module, step: int, collective: bool) -> Stop | None:
        """After optimizer step ``step`` (the loop calls it where :attr:`watches_steps`; it
        writes the position's next step itself): the replica check and the step limit.

        Without ``collective`` (an epoch whose ranks have different batch counts) neither
        runs: both involve every rank at the same step.
        """
        if not collective:
            return None
        if self.check_every and step % self.check_every == 0:
            self._check_replicas(model, step)
        if self.max_steps is not None and step >= self.max_steps:
            return Stop(
                StopKind.STEP_LIMIT, f"stopped after {step} optimizer steps ({MAX_STEPS_ENV})"
            )
        return None

    def _check_replicas(self, model: nn.Module, step: int) -> None:
        divergence = check_replicas(model, step)
        found = vars(divergence) if divergence is not None else None
        # Every callback hears of it; one that reports it itself (verify) keeps training on.
        reported = self._events.call("on_replicas_checked", step, found)
        if divergence is not None and not any(reported):
            raise divergence.error()
