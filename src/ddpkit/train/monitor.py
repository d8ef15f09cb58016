"""What watches the Trainer's steps: hang watchdog, replica check, verify's recorder, step limit.

The Trainer tells the monitor where it is (a batch is being loaded, forward, backward, the
optimizer step) and when a step is done; the monitor passes that on to whichever watchers are
on, so the training loop carries no diagnostics code of its own:

- the hang watchdog times each micro-batch, from loading it to the optimizer step;
- ``check_replicas_every=M`` (or ``DDPKIT_CHECK_REPLICAS_EVERY``, which FSDP's sharded
  models ignore) compares the replicas every M optimizer steps and raises
  :class:`~ddpkit.errors.ReplicaDivergenceError`;
- under ``ddpkit verify`` the recorder notes samples and states (see :mod:`verifyrecord`);
- ``DDPKIT_MAX_STEPS=K`` (set by ``ddpkit verify`` and ``ddpkit doctor --run``) ends the
  script after K optimizer steps, every rank together, with exit code 0.

Example:
    >>> from ddpkit.train.monitor import env_int
    >>> env_int("DDPKIT_MAX_STEPS", {"DDPKIT_MAX_STEPS": "20"})
    20
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ddpkit.errors import ConfigError
from ddpkit.parallel.fsdp import is_sharded
from ddpkit.parallel.replicas import check_replicable, check_replicas
from ddpkit.runtime.collectives import barrier, print0
from ddpkit.runtime.watchdog import current_watchdog
from ddpkit.tools.verify.recorder import active_recorder

MAX_STEPS_ENV = "DDPKIT_MAX_STEPS"
CHECK_REPLICAS_ENV = "DDPKIT_CHECK_REPLICAS_EVERY"


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

    def __init__(self, model: Any, check_replicas_every: int | None) -> None:
        self.watchdog = current_watchdog()
        self.recorder = active_recorder()
        if check_replicas_every:
            check_replicable(model)  # asked for by name: refuse what cannot be checked
        from_env = env_int(CHECK_REPLICAS_ENV) if not is_sharded(model) else None
        self.check_every = check_replicas_every or from_env
        self.max_steps = env_int(MAX_STEPS_ENV)
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
            if self.recorder is not None and not evaluation:
                self.recorder.batch_seen(batch)
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

    def fit_started(self, trainer: Any, loader: Any) -> None:
        """Called once per ``fit``, before the first step."""
        self._step = trainer.step + 1
        if self.recorder is not None:
            self.recorder.fit_started(trainer, loader)

    def epoch_started(self, loader: Any) -> None:
        """Called after the sampler was told the epoch."""
        if self.recorder is not None:
            self.recorder.epoch_started(loader)

    def step_done(self, trainer: Any, step: int) -> None:
        """After optimizer step ``step``: replica check, and the step limit."""
        if self.check_every and step % self.check_every == 0:
            self._check_replicas(trainer.model, step)
        if self.max_steps is not None and step >= self.max_steps:
            self.fit_finished(trainer, step)
            _stop_all_ranks(step)

    def fit_finished(self, trainer: Any, step: int) -> None:
        """Training ended (or was stopped): verify's record is written."""
        if self.recorder is not None:
            self.recorder.finish(trainer, step)

    def _check_replicas(self, model: Any, step: int) -> None:
        divergence = check_replicas(model, step)
        if self.recorder is not None:  # verify reports it beside its other findings
            self.recorder.replicas_checked(step, divergence)
        elif divergence is not None:
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


def env_int(name: str, environ: Mapping[str, str] | None = None) -> int | None:
    """A positive integer setting from the environment, or None when unset.

    Example:
        >>> env_int("DDPKIT_MAX_STEPS", {}) is None
        True
    """
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{name}={raw!r} must be a positive integer")
    return int(raw)


def _stop_all_ranks(step: int) -> None:
    # Every rank reaches the limit at the same step; after the barrier none waits on
    # another, so leaving without tearing down the group is safe, and no later code of the
    # script (more training, evaluation) runs on a model the limit cut short.
    barrier()
    print0(f"ddpkit: stopped after {step} optimizer steps ({MAX_STEPS_ENV})")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
