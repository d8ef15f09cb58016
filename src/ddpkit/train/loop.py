"""Your own training loop, with the Trainer's guarantees: ``TrainLoop``.

For users who keep their ``for batch in loader:`` loop (Lightning Fabric's and HF
Accelerate's way) and still want ddpkit's checkpoints, stop handling, loss checks and hang
labels. Give it what to checkpoint, iterate through it, and mark the backward and the update:

.. code-block:: python

    loop = ddpkit.TrainLoop({"model": model, "optimizer": opt, "scheduler": sched},
                            checkpoint_dir="runs/x", save_every_steps=50)
    for epoch in loop.epochs(10):             # resumes where a checkpoint left off
        for x, y in loop.batches(train):      # on the device; a resumed epoch skips what it did
            loss = F.cross_entropy(model(x), y)
            loop.backward(loss)               # loss.backward(), with the NaN/inf check
            loop.optimizer_step(opt)          # guard's verdict, opt.step(), opt.zero_grad()
            sched.step()

What you get:

- **Checkpoints with exact resume.** Every ``save_every`` epochs / ``save_every_steps``
  steps and at the end, written atomically by rank 0 (FSDP: every rank its shards): the
  models (unwrapped), optimizers, any entry with ``state_dict()`` (a scheduler, an EMA), plain
  values (a step counter) and every rank's random state and loader position. A new run
  resumes by itself, part-way through an epoch included, to bit-identical parameters. A
  checkpoint is taken only at a step boundary: when the loop body that called
  ``optimizer_step`` has finished (so your ``sched.step()`` is in it).
- **Stop requests.** SIGTERM / SIGUSR1: every rank checkpoints at the same step and exits
  with code 75; running the same command again resumes.
- **Loss checks.** ``backward(loss)`` notes the loss; ``optimizer_step`` raises
  :class:`~ddpkit.errors.NonFiniteLossError` naming the step and rank before a NaN/inf update
  (``nonfinite_loss="skip"``: every rank skips that step).
- **Hang labels and verify.** The watchdog names the step and the phase (loading the batch,
  your loop body, backward + gradient all-reduce, optimizer step), and ``ddpkit verify``
  follows the loop through these calls.

Example:
    >>> import torch, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> model = ddpkit.prepare_model(torch.nn.Linear(2, 1))
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> data = torch.utils.data.TensorDataset(torch.ones(4, 2), torch.zeros(4, 1))
    >>> loop = TrainLoop({"model": model, "optimizer": opt})
    >>> for epoch in loop.epochs(2):
    ...     for x, y in loop.batches(ddpkit.prepare_loader(data, batch_size=2)):
    ...         loop.backward(torch.nn.functional.mse_loss(model(x), y))
    ...         loop.optimizer_step(opt)
    >>> loop.step, loop.epoch
    (4, 2)
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Any

import torch
from torch import nn

from ddpkit._core.validate import check_positive_int
from ddpkit.data.batches import to_device
from ddpkit.errors import ConfigError
from ddpkit.parallel.group import ModelGroup
from ddpkit.parallel.strategy import strategy_of
from ddpkit.runtime.seeding import configured_seed, seed_rank_streams
from ddpkit.runtime.session import current_world
from ddpkit.train.callbacks import Callbacks
from ddpkit.train.explog import ExperimentLogger
from ddpkit.train.guards import NonFiniteLoss, StepGuard
from ddpkit.train.monitor import StepMonitor
from ddpkit.train.precision import MixedPrecision
from ddpkit.train.progress import EpochProgress
from ddpkit.train.resume import Checkpointer
from ddpkit.train.startup import setup_record
from ddpkit.train.updates import Updates


class TrainLoop(Updates):
    """A hand-written loop's checkpoints, resume, stop requests and checks; see the module
    docstring.

    ``state`` names what to checkpoint: the models (``nn.Module``) and optimizers it holds
    are saved as the Trainer saves them, every other entry as :mod:`ddpkit.train.stateful`
    says (objects with ``state_dict()`` in place, plain values put back into ``state``).

    Example::

        loop = TrainLoop({"model": model, "optimizer": opt, "step_count": 0}, "runs/x")
    """

    def __init__(
        self,
        state: dict[str, Any],
        checkpoint_dir: str | os.PathLike[str] | None = None,
        *,
        save_every: int | None = None,
        save_every_steps: int | None = None,
        keep_last: int | None = 3,
        nonfinite_loss: NonFiniteLoss = "error",
        check_replicas_every: int | None = None,
        log_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        checkpoints = Checkpointer.configured(
            checkpoint_dir, save_every, save_every_steps, keep_last
        )
        models, optimizers, rest = _split_state(state)
        super().__init__(_one_or_named(models), _one_or_named(optimizers), None, rest)
        self.world = current_world()
        self.model = next(iter(models.values())) if len(models) == 1 else ModelGroup(models)
        self.strategy = strategy_of(self.model)
        self.precision = MixedPrecision("fp32", self.world.device)
        self._logger = ExperimentLogger(log_dir) if log_dir is not None else None
        self.callbacks = Callbacks([self._logger] if self._logger else [])  # flushes at saves
        self.checkpoints = checkpoints
        self._user_state = state
        self._guard = StepGuard(nonfinite_loss, exchange_stops=checkpoints is not None)
        self._monitor = StepMonitor(self.model, check_replicas_every)
        self._progress: EpochProgress | None = None
        self._epoch_running: int | None = None
        self._loader: Any = None
        self._stepped = False  # an optimizer step since the last step boundary
        self._started = False

    def epochs(self, epochs: int) -> Iterator[int]:
        """The epochs still to train, from 0; resumes from the newest checkpoint first.

        After each epoch's body (your evaluation included) the epoch's checkpoint is
        written when one is due.
        """
        check_positive_int("epochs", epochs)
        self._progress = self.checkpoints.resume(self, None) if self.checkpoints else None
        self.callbacks.call("on_fit_start", self)  # the experiment log continues from here
        self._started = False  # the watchers hear of the start with the first loader
        seed = configured_seed()
        if seed is not None:  # as the Trainer does; a resumed epoch restores its own
            seed_rank_streams(seed, self.world.rank)
        with self._catching_stop_signals():
            for epoch in range(self.epoch, epochs):
                self._epoch_running = epoch
                yield epoch
                self._end_epoch(epoch, epochs)
        self._epoch_running = None
        self._monitor.fit_finished(self.model, self.step)
        self.callbacks.call("on_fit_end", self)

    def log(self, metrics: Mapping[str, Any]) -> None:
        """Log ``metrics`` (numbers or one-element tensors) at the current step to the
        ``log_dir`` given (TensorBoard and CSV, rank 0 only; a resumed run continues the
        curves). Without a ``log_dir``, a ConfigError.

        Example::

            loop.log({"train/loss": loss, "train/lr": opt.param_groups[0]["lr"]})
        """
        if self._logger is None:
            raise ConfigError("TrainLoop.log needs TrainLoop(..., log_dir=...) to write to")
        if self._logger.log is not None:  # the step just taken counts before its boundary
            self._logger.log.log(metrics, self.step + int(self._stepped))

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """This epoch's batches of ``loader``, on the rank's device; a resumed epoch starts
        after the batches it had done. Call it inside ``for epoch in loop.epochs(N)``."""
        if self._epoch_running is None:
            raise ConfigError(
                "TrainLoop.batches(loader) runs inside 'for epoch in loop.epochs(N):'"
            )
        if not self._started:
            self._monitor.fit_started(self.model, setup_record(self, loader), self.step)
            self._started = True
        progress = self._progress_for(self._epoch_running, loader)
        iterator = progress.batches_from(loader)  # tells the sampler the epoch
        self._monitor.epoch_started(loader)
        total = len(loader) if isinstance(loader, Sized) else None
        with self._monitor.ending():
            for index, batch in enumerate(self._monitor.batches(iterator), start=progress.batches):
                self._monitor.phase("the loop body")
                yield to_device(batch, self.world.device)
                progress.batches = index + 1
                if self._stepped:
                    last = index + 1 == total or getattr(iterator, "last", False)
                    self._step_boundary(progress, last=last)

    def state_dict(self, weights: bool = True) -> dict[str, Any]:
        """What a checkpoint holds (see the Trainer's); your plain values are read now."""
        self.state.update({name: self._user_state[name] for name in self.state})
        return super().state_dict(weights)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint; plain values go back into the dict you gave."""
        super().load_state_dict(state)
        self._user_state.update(self.state)

    def _progress_for(self, epoch: int, loader: Any) -> EpochProgress:
        self._loader = loader
        if self._progress is None or self._progress.epoch != epoch:
            self._progress = EpochProgress(epoch, loader)
        return self._progress

    def _step_boundary(self, progress: EpochProgress, last: bool) -> None:
        """After a loop body that stepped: count the step, check, checkpoint or stop."""
        self._stepped = False
        stop, self._pending_stop = self._pending_stop, None
        self.step += 1
        self._monitor.next_step(self.step + 1)
        self._monitor.step_done(self.model, self.step)
        if self.checkpoints is not None:
            self.checkpoints.step_done(self, progress, stop, last)

    def optimizer_step(self, *optimizers: torch.optim.Optimizer) -> None:
        """The guard's verdict, then ``opt.step()`` and ``opt.zero_grad()`` for each of
        ``optimizers`` (default: all in the state). Every rank calls it alike."""
        super().optimizer_step(*optimizers)
        self._stepped = True

    def _end_epoch(self, epoch: int, epochs: int) -> None:
        self.epoch = epoch + 1
        stop = self._guard.epoch_end(self._stop_signal())
        if self.checkpoints is not None:
            self.checkpoints.epoch_done(self, self._loader, epochs, stop)


def _split_state(
    state: dict[str, Any],
) -> tuple[dict[str, nn.Module], dict[str, torch.optim.Optimizer], dict[str, Any]]:
    models = {k: v for k, v in state.items() if isinstance(v, nn.Module)}
    optimizers = {k: v for k, v in state.items() if isinstance(v, torch.optim.Optimizer)}
    if not models or not optimizers:
        raise ConfigError(
            "TrainLoop's state needs the model(s) and optimizer(s) it checkpoints: "
            "TrainLoop({'model': model, 'optimizer': opt, ...})"
        )
    rest = {k: v for k, v in state.items() if k not in models and k not in optimizers}
    return models, optimizers, rest


def _one_or_named(objects: dict[str, Any]) -> Any:
    return next(iter(objects.values())) if len(objects) == 1 else objects
