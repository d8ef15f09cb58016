"""What watches the Trainer's steps: hang watchdog, replica check, observers, step limit.

The Trainer tells the monitor where it is (a batch is being loaded, forward, backward, the
optimizer step) and when a step is done; the monitor passes that on to whichever watchers are
on, so the training loop carries no diagnostics code of its own:

- the hang watchdog times each micro-batch, from loading it to the optimizer step;
- ``check_replicas_every=M`` (or ``DDPKIT_CHECK_REPLICAS_EVERY``, which strategies without
  identical replicas ignore) compares the replicas every M optimizer steps and raises
  :class:`~ddpkit.errors.ReplicaDivergenceError`;
- registered observers (:mod:`ddpkit.runtime.observers`; ``ddpkit verify``'s recorder is
  one) hear of the start, each epoch, each training batch, each replica check and the end;
- ``DDPKIT_MAX_STEPS=K`` (set by ``ddpkit verify`` and ``ddpkit doctor --run``) ends the
  script after K optimizer steps, every rank together, with exit code 0.

Example:
    >>> backward_label(final=False, world_size=2)
    'backward (no sync)'
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from torch import nn

from ddpkit._core.envvars import positive_int_var
from ddpkit._core.log import logger
from ddpkit._core.protocol import CHECK_REPLICAS_ENV, MAX_STEPS_ENV
from ddpkit._core.system import flush_and_exit
from ddpkit.parallel.replicas import check_replicable, check_replicas
from ddpkit.parallel.strategy import strategy_of
from ddpkit.runtime.collectives import barrier
from ddpkit.runtime.observers import observers
from ddpkit.runtime.watchdog import current_watchdog


class StepMonitor:
    """The Trainer's watchers, configured once per ``fit``.

    Example:
        >>> import torch, ddpkit
        >>> _ = ddpkit.init(hang_timeout=0)
        ddpkit: world size 1 ...
        >>> monitor = StepMonitor(torch.nn.Linear(2, 2), check_replicas_every=None)
        >>> [b for b in monitor.batches([1, 2])]
        [1, 2]
        >>> ddpkit.shutdown()
    """

    def __init__(self, model: nn.Module, check_replicas_every: int | None) -> None:
        self.watchdog = current_watchdog()
        if check_replicas_every:
            check_replicable(model)  # asked for by name: refuse what cannot be checked
        replicated = strategy_of(model).replicas_identical
        from_env = positive_int_var(CHECK_REPLICAS_ENV) if replicated else None
        self.check_every = check_replicas_every or from_env
        self.max_steps = positive_int_var(MAX_STEPS_ENV)
        self._step = 0

    def batches(self, loader: Iterable[Any], evaluation: bool = False) -> Iterator[Any]:
        """The loader's batches, each timed by the watchdog from the moment it is requested.

        The caller ends the last one with :meth:`batch_done` (in a ``finally``: a generator
        left by an exception is not finalized at once).
        """
        iterator = iter(loader)
        while True:
            self._begin(f"{self._where(evaluation)}: loading the batch")
            try:
                batch = next(iterator)
            except StopIteration:
                self.batch_done()
                return
            if not evaluation:
                for observer in observers():
                    observer.batch_loaded(batch)
            yield batch

    def next_step(self, step: int) -> None:
        """The optimizer step number the next batch belongs to."""
        self._step = step

    def phase(self, name: str, evaluation: bool = False) -> None:
        """The current batch entered ``name`` (forward, backward, optimizer step)."""
        if self.watchdog is not None:
            self.watchdog.relabel(f"{self._where(evaluation)}: {name}")

    def batch_done(self) -> None:
        """The current batch is finished (its optimizer step too, if it had one)."""
        if self.watchdog is not None:
            self.watchdog.end(None)

    @contextlib.contextmanager
    def ending(self) -> Iterator[None]:
        """Around a loop over :meth:`batches`: its last batch is ended however the loop ends.

        A batch generator left by an exception is not finalized at once, so the watchdog
        would go on timing that batch.
        """
        try:
            yield
        finally:
            self.batch_done()

    def fit_started(self, model: nn.Module, setup: Mapping[str, Any], step: int) -> None:
        """Called once per ``fit``, before the first step; ``step`` is the steps taken."""
        self._step = step + 1
        for observer in observers():
            observer.fit_started(model, setup)

    def epoch_started(self, loader: Iterable[Any]) -> None:
        """Called after the sampler was told the epoch."""
        for observer in observers():
            observer.epoch_started(loader)

    def step_done(self, model: nn.Module, step: int) -> None:
        """After optimizer step ``step``: replica check, and the step limit."""
        if self.check_every and step % self.check_every == 0:
            self._check_replicas(model, step)
        if self.max_steps is not None and step >= self.max_steps:
            self.fit_finished(model, step)
            _stop_all_ranks(step)

    def fit_finished(self, model: nn.Module, steps: int) -> None:
        """Training ended (or was stopped by the step limit)."""
        for observer in observers():
            observer.fit_finished(model, steps)

    def _check_replicas(self, model: nn.Module, step: int) -> None:
        divergence = check_replicas(model, step)
        found = vars(divergence) if divergence is not None else None
        # Every observer hears of it; one that reports it itself (verify) keeps training on.
        reported = [observer.replicas_checked(step, found) for observer in observers()]
        if divergence is not None and not any(reported):
            raise divergence.error()

    def _where(self, evaluation: bool) -> str:
        return "evaluation" if evaluation else f"step {self._step}"

    def _begin(self, label: str) -> None:
        if self.watchdog is not None:
            self.watchdog.end(None)
            self.watchdog.begin(label)


def backward_label(final: bool, world_size: int) -> str:
    """What the watchdog calls a backward pass: whether it carries the gradient all-reduce.

    Example:
        >>> backward_label(final=True, world_size=2)
        'backward + gradient all-reduce'
    """
    if world_size == 1:
        return "backward"
    return "backward + gradient all-reduce" if final else "backward (no sync)"


def _stop_all_ranks(step: int) -> None:
    # Every rank reaches the limit at the same step; after the barrier none waits on
    # another, so leaving without tearing down the group is safe, and no later code of the
    # script (more training, evaluation) runs on a model the limit cut short.
    barrier()
    logger.info(f"stopped after {step} optimizer steps ({MAX_STEPS_ENV})")
    flush_and_exit(0)
