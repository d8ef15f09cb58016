"""What watches the loop's steps: the hang watchdog's labels, the replica check, the step limit.

The loop tells the monitor where it is (loading a batch, forward, backward, the optimizer
step) and when a step is done; the monitor tells whichever watchers are on:

- the hang watchdog times each micro-batch, from loading it to the optimizer step;
- ``check_replicas_every=M`` (or ``DDPKIT_CHECK_REPLICAS_EVERY``, which strategies without
  identical replicas ignore) compares the replicas every M optimizer steps; a divergence is
  passed to the callbacks' ``on_replicas_checked`` and raises
  :class:`~ddpkit.errors.ReplicaDivergenceError` unless one reports it itself (verify does);
- ``DDPKIT_MAX_STEPS=K`` (set by ``ddpkit verify`` and ``ddpkit doctor --run``) makes the
  K-th step's end a :class:`~ddpkit.train.stop.Stop` with exit code 0.

Example:
    >>> backward_label(final=False, world_size=2)
    'backward (no sync)'
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from torch import nn

from ddpkit._core.envvars import positive_int_var
from ddpkit._core.protocol import CHECK_REPLICAS_ENV, MAX_STEPS_ENV
from ddpkit.observe.steptime import Phase, StepClock
from ddpkit.parallel.replicas import check_replicable, check_replicas
from ddpkit.parallel.strategy import strategy_of
from ddpkit.runtime.callbacks import Events
from ddpkit.runtime.session import world_or_none
from ddpkit.runtime.watchdog import current_watchdog
from ddpkit.train.stop import Stop, StopKind


class StepMonitor:
    """The loop's watchers, configured once per run.

    Example:
        >>> import torch, ddpkit
        >>> _ = ddpkit.init(hang_timeout=0)
        ddpkit: world size 1 ...
        >>> monitor = StepMonitor(torch.nn.Linear(2, 2), None, Events())
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
        self._events = events
        self._where_training = "step 0"  # the labels' prefix, made once a step, not per label
        world = world_or_none()  # labels only: a monitor made outside a run has a world of 1
        size = world.world_size if world is not None else 1
        self._backward_labels = (backward_label(False, size), backward_label(True, size))

    def batches(
        self, loader: Iterable[Any], evaluation: bool = False, clock: StepClock | None = None
    ) -> Iterator[Any]:
        """The loader's batches, each timed by the watchdog from the moment it is requested
        (the last one is ended by :meth:`ending`), and by ``clock`` as data. One generator
        for both: each layer between the loader and the loop is a resumption per batch."""
        iterator, watchdog = iter(loader), self.watchdog
        while True:
            if watchdog is not None:
                watchdog.end(None)
                where = "evaluation" if evaluation else self._where_training
                watchdog.begin(f"{where}: loading the batch")
            if clock is not None:
                clock.enter(Phase.DATA)
            try:
                batch = next(iterator)
            except StopIteration:
                if clock is not None:
                    clock.enter(Phase.OTHER)
                self.batch_done()
                return
            yield batch

    def next_step(self, step: int) -> None:
        """The optimizer step number the next batch belongs to."""
        self._where_training = f"step {step}"

    def phase(self, name: str, evaluation: bool = False) -> None:
        """The current batch entered ``name`` (forward, backward, optimizer step)."""
        if self.watchdog is not None:
            where = "evaluation" if evaluation else self._where_training
            self.watchdog.relabel(f"{where}: {name}")

    def backward(self, final: bool) -> None:
        """The current batch entered its backward pass (the group's ``final``: it syncs)."""
        if self.watchdog is not None:
            self.watchdog.relabel(f"{self._where_training}: {self._backward_labels[final]}")

    def batch_done(self) -> None:
        """The current batch is finished (its optimizer step too, if it had one)."""
        if self.watchdog is not None:
            self.watchdog.end(None)

    @contextlib.contextmanager
    def ending(self) -> Iterator[None]:
        """Around a loop over :meth:`batches`: its last batch is ended however the loop ends
        (a generator left by an exception is not finalized at once)."""
        try:
            yield
        finally:
            self.batch_done()

    def step_done(self, model: nn.Module, step: int, collective: bool) -> Stop | None:
        """After optimizer step ``step``: the labels name the next one, then the replica
        check and the step limit.

        Without ``collective`` (an epoch whose ranks have different batch counts) neither
        runs: both involve every rank at the same step.
        """
        self._where_training = f"step {step + 1}"
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


def backward_label(final: bool, world_size: int) -> str:
    """What the watchdog calls a backward pass: whether it carries the gradient all-reduce.

    Example:
        >>> backward_label(final=True, world_size=2)
        'backward + gradient all-reduce'
    """
    if world_size == 1:
        return "backward"
    return "backward + gradient all-reduce" if final else "backward (no sync)"
