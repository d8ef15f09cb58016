"""The training loop: epochs, sharded batches, metrics reduced over ranks, checkpoints, resume.

The loop is the same for one process and for N: the sampler is told the epoch, metrics are
summed over ranks as ``(loss * samples, samples, correct)`` so means are sample-weighted, the
progress bar and log lines come from rank 0 only, and rank 0 alone writes checkpoints (under
FSDP every rank writes its shards). A new ``fit`` resumes from the newest valid checkpoint in
``checkpoint_dir`` by itself, part-way through an epoch included (see :mod:`ddpkit.train.resume`).
Before each optimizer step the step guard (:mod:`ddpkit.train.guards`) checks the loss and lets
every rank agree on stop requests (SIGTERM / SIGUSR1: checkpoint and exit 75, see
:mod:`ddpkit.train.preemption`). When ranks have different numbers of batches, the loop runs under
torch's ``Join`` so the ranks that finish first keep answering the others' all-reduces
instead of leaving them to hang.

Example:
    >>> import torch, torch.nn.functional as F, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    >>> model = ddpkit.prepare_model(torch.nn.Linear(4, 2))
    >>> trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy)
    >>> loader = ddpkit.prepare_loader(data, batch_size=8)
    >>> history = trainer.fit(loader, epochs=1)  # doctest: +ELLIPSIS
    ddpkit: training an unwrapped model; global batch 8 = 8 per device x 1 rank; lr 0.1; fp32
    epoch 1/1 ...
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

import torch
from torch import nn

from ddpkit._core.log import logger
from ddpkit._core.validate import SchedulerInterval, check_positive_int, check_training_options
from ddpkit.data.loader import inputs_and_targets, real_samples_on_rank
from ddpkit.errors import CheckpointError, NonFiniteLossError
from ddpkit.parallel.strategy import strategy_of
from ddpkit.runtime.collectives import print0
from ddpkit.runtime.reporting import report
from ddpkit.runtime.seeding import configured_seed, seed_rank_streams
from ddpkit.runtime.session import current_world
from ddpkit.train.guards import NonFiniteLoss, StepGuard
from ddpkit.train.metrics import MetricSums, format_epoch
from ddpkit.train.monitor import StepMonitor, backward_label
from ddpkit.train.precision import MixedPrecision, Precision
from ddpkit.train.preemption import StopSignals
from ddpkit.train.progress import EpochProgress
from ddpkit.train.resume import Checkpointer
from ddpkit.train.startup import describe_training, setup_record
from ddpkit.train.steplog import StepLog, progress_bar
from ddpkit.train.uneven import join_unless, same_batch_count

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
CHECKPOINT_FORMAT = "ddpkit.checkpoint/2"


class Trainer:
    """Trains a prepared model; rank 0 logs and checkpoints; resumes automatically.

    ``checkpoint_dir`` turns on checkpoints: one every ``save_every`` epochs and/or every
    ``save_every_steps`` optimizer steps, and one at the end of ``fit``; only the newest
    ``keep_last`` are kept (None: all). A checkpoint taken part-way through an epoch resumes
    at the same batch with the same random state, so a job stopped and resumed ends with
    the parameters of an uninterrupted one. With a ``checkpoint_dir``, SIGTERM or SIGUSR1
    during ``fit`` checkpoints at the next step and exits with code 75 (see
    :mod:`ddpkit.train.preemption`). ``nonfinite_loss="error"`` stops at a NaN/inf loss naming the
    step and rank, before that rank's update; ``"skip"`` skips such steps on every rank.
    ``accumulate=K`` sums the gradients of K batches before each optimizer step, skipping
    the gradient all-reduce on the first K-1 (DDP's ``no_sync``): the same step as one
    K-times larger batch. ``clip_grad_norm`` clips by the global gradient norm before each
    step. ``precision`` is ``"fp32"``, ``"bf16"`` (autocast, CPU or GPU) or ``"fp16"``
    (autocast + loss scaling, GPU). ``scheduler`` is stepped after every optimizer step
    (``scheduler_interval="step"``) or every epoch (``"epoch"``). Checkpoints hold the
    unwrapped model (no ``module.`` prefix), optimizer, scheduler, grad scaler, epoch, step,
    metrics and every rank's random state. ``check_replicas_every=M`` compares the DDP
    replicas across ranks every M optimizer steps and stops with
    :class:`~ddpkit.errors.ReplicaDivergenceError`, naming the ranks and tensors that differ
    (see :mod:`ddpkit.parallel.replicas`). ``log_every=N`` prints a line every N optimizer steps
    (rank 0's loss and the pace), for logs where tqdm's bar is hidden. Each batch is watched
    by the hang watchdog (``ddpkit.init(hang_timeout=...)``).

    Example:
        >>> import torch, torch.nn.functional as F, ddpkit
        >>> _ = ddpkit.init()
        ddpkit: world size 1 ...
        >>> model = ddpkit.prepare_model(torch.nn.Linear(3, 2))
        >>> opt = torch.optim.Adam(model.parameters())
        >>> Trainer(model, opt, F.cross_entropy, precision="bf16").epoch
        0
        >>> ddpkit.shutdown()
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        save_every: int | None = None,
        *,
        save_every_steps: int | None = None,
        keep_last: int | None = 3,
        accumulate: int = 1,
        clip_grad_norm: float | None = None,
        precision: Precision = "fp32",
        scheduler: Any = None,
        scheduler_interval: SchedulerInterval = "step",
        check_replicas_every: int | None = None,
        nonfinite_loss: NonFiniteLoss = "error",
        log_every: int | None = None,
    ) -> None:
        checkpoints = Checkpointer.configured(
            checkpoint_dir, save_every, save_every_steps, keep_last
        )
        check_training_options(accumulate, clip_grad_norm, check_replicas_every, scheduler_interval)
        if log_every is not None:
            check_positive_int("log_every", log_every)
        self.world = current_world()
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.checkpoints = checkpoints
        self.accumulate = accumulate
        self.clip_grad_norm = clip_grad_norm
        self.strategy = strategy_of(model)  # what the loop, resume and checks ask of it
        self.precision = MixedPrecision(precision, self.world.device, sharded=self.strategy.sharded)
        self.scheduler = scheduler
        self.scheduler_interval = scheduler_interval
        self.epoch = 0  # completed epochs
        self.step = 0  # optimizer steps taken (skipped ones included)
        self.skipped_steps = 0  # steps skipped for a non-finite loss
        self.history: list[dict[str, float]] = []
        self._announced = False
        self._guard = StepGuard(nonfinite_loss, exchange_stops=checkpoints is not None)
        self._signals: StopSignals | None = None
        self._monitor = StepMonitor(model, check_replicas_every)
        self._log = StepLog(log_every)

    def fit(
        self, train: Iterable[Any], epochs: int, val: Iterable[Any] | None = None
    ) -> list[dict[str, float]]:
        """Train until ``epochs`` epochs are complete (resuming if a checkpoint exists).

        Returns the per-epoch metrics: ``loss`` (sample-weighted over all ranks), ``accuracy``
        for classifiers, ``time_s``, and ``val_*`` when ``val`` is given.

        Example::

            trainer.fit(train_loader, epochs=10, val=val_loader)
        """
        check_positive_int("epochs", epochs)
        progress = self.checkpoints.resume(self, train) if self.checkpoints else None
        setup = setup_record(self, train)
        self._announce(train, setup)  # seeds the rank streams; a resumed epoch restores its own
        self._monitor.fit_started(self.model, setup, self.step)
        if self.epoch >= epochs:
            logger.info(f"already trained {self.epoch} of {epochs} epochs; nothing to do")
        with self._catching_stop_signals():
            for epoch in range(self.epoch, epochs):
                if progress is None or progress.epoch != epoch:  # else: the resumed epoch
                    progress = EpochProgress(epoch, train)
                self._run_epoch(train, progress, epochs, val)
        self._monitor.fit_finished(self.model, self.step)
        return self.history

    def resume(self) -> bool:
        """Load the newest valid checkpoint of ``checkpoint_dir`` now; False when there is none.

        ``fit`` does this by itself; call it to evaluate a checkpoint without training.

        Example::

            trainer.resume() and trainer.evaluate(val_loader)
            # {'loss': 0.41, 'accuracy': 0.88, 'top5_accuracy': 0.99}
        """
        return self.checkpoints is not None and self.checkpoints.resume(self, None) is not None

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

    def _run_epoch(
        self, train: Iterable[Any], progress: EpochProgress, epochs: int, val: Any
    ) -> None:
        metrics = {"epoch": float(progress.epoch + 1), **self._train_epoch(train, progress, epochs)}
        if val is not None:
            metrics.update({f"val_{k}": v for k, v in self.evaluate(val).items()})
        self.history.append(metrics)
        self.epoch = progress.epoch + 1
        print0(format_epoch(metrics, epochs))
        report("epoch", **metrics)
        stop = self._guard.epoch_end(self._stop_signal())
        if self.checkpoints is not None:
            self.checkpoints.epoch_done(self, train, epochs, stop)

    @torch.no_grad()
    def evaluate(self, loader: Iterable[Any]) -> dict[str, float]:
        """Mean loss (and accuracy for classifiers) over every rank's shard of ``loader``.

        Exact over the whole dataset: samples the sampler repeated to even out the shards
        are left out, so the metric is the one a single process would compute.

        Example::

            trainer.evaluate(val_loader)   # {'loss': 0.08, 'accuracy': 0.97}
        """
        self.model.eval()
        sums = MetricSums(self.world.device)
        remaining = real_samples_on_rank(loader)  # padded duplicates are not counted
        with self._monitor.ending():
            for batch in self._monitor.batches(loader, evaluation=True):
                inputs, targets = inputs_and_targets(batch, self.world.device)
                if remaining is not None:
                    keep = max(0, min(len(targets), remaining))
                    remaining -= keep
                self._monitor.phase("forward", evaluation=True)
                with self.precision.autocast():
                    outputs = self.model(inputs)  # every rank runs every batch: FSDP gathers
                    if remaining is not None:
                        outputs, targets = outputs[:keep], targets[:keep]
                    if len(targets):
                        sums.add(self.loss_fn(outputs, targets), outputs, targets)
        return sums.reduce()

    def state_dict(self, weights: bool = True) -> dict[str, Any]:
        """Everything needed to resume: model (unwrapped), optimizer, scheduler, epoch, metrics.

        ``weights=False`` leaves out the model and optimizer (FSDP saves those as shards).

        Example::

            sorted(trainer.state_dict())
            # ['epoch', 'format', 'grad_scaler', 'history', 'model', 'optimizer', ...]
        """
        state = {
            "format": CHECKPOINT_FORMAT,
            "epoch": self.epoch,
            "step": self.step,
            "skipped_steps": self.skipped_steps,
            "history": list(self.history),
            "world_size": self.world.world_size,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "grad_scaler": self.precision.state_dict(),
        }
        if weights:
            state["model"] = self.strategy.unwrap(self.model).state_dict()
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` output (for example a loaded checkpoint).

        Example::

            trainer.load_state_dict(ddpkit.checkpoint.load_checkpoint(path))
        """
        if "model" in state:
            try:
                self.strategy.unwrap(self.model).load_state_dict(state["model"])
                self.optimizer.load_state_dict(state["optimizer"])
            except (KeyError, RuntimeError, ValueError) as err:
                raise CheckpointError(
                    f"checkpoint does not match this model/optimizer: {str(err).strip()[:500]}"
                ) from err
        self.epoch = int(state["epoch"])
        self.step = int(state.get("step", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.history = list(state.get("history", []))
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.precision.load_state_dict(state.get("grad_scaler") or {})

    def _train_epoch(
        self, loader: Iterable[Any], progress: EpochProgress, epochs: int
    ) -> dict[str, float]:
        batches = progress.batches_from(loader)  # tells the sampler the epoch
        self._monitor.epoch_started(loader)
        self.model.train()
        total = len(loader) if isinstance(loader, Sized) else None
        self.optimizer.zero_grad(set_to_none=True)
        desc = f"epoch {progress.epoch + 1}/{epochs}"
        bar = progress_bar(batches, total, progress.batches, desc)
        even = same_batch_count(self.model, total, self._guard.policy)
        with join_unless(even, self.model), self._monitor.ending():
            for index, batch in enumerate(self._monitor.batches(bar), start=progress.batches):
                final = (index + 1) % self.accumulate == 0 or index + 1 == total
                outputs, targets, loss = self._micro_step(batch, index, total, final)
                progress.sums.add(loss, outputs, targets)
                if final:
                    stop = self._optimizer_step(collective=even)
                    progress.batches = index + 1
                    self._log.step_done(self.step, progress, epochs, total, loss)
                    if self.checkpoints is not None:
                        self.checkpoints.step_done(self, progress, stop, last=index + 1 == total)
        if self.scheduler is not None and self.scheduler_interval == "epoch":
            self.scheduler.step()
        return {**progress.sums.reduce(), "time_s": progress.elapsed_s}

    def _micro_step(
        self, batch: Any, index: int, total: int | None, final: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Forward and backward of one batch; returns detached outputs, targets, loss."""
        inputs, targets = inputs_and_targets(batch, self.world.device)
        self._monitor.phase("forward")
        with self._gradient_sync(final):
            with self.precision.autocast():
                outputs = self.model(inputs)
                loss = self.loss_fn(outputs, targets)
            self._guard.note_loss(loss)
            self._monitor.phase(backward_label(final, self.world.world_size))
            self.precision.backward(loss / _group_size(index, total, self.accumulate))
        return outputs.detach(), targets, loss.detach()

    def _gradient_sync(self, final: bool) -> contextlib.AbstractContextManager[Any]:
        """All-reduce gradients only on the last micro-step of an accumulation group."""
        if final:
            return contextlib.nullcontext()
        return self.strategy.no_sync(self.model)

    def _optimizer_step(self, collective: bool) -> str | None:
        """The guard's verdict, then the update; returns a stop signal all ranks agreed on.

        Without ``collective`` (uneven batches under Join) a stop waits for the epoch's end.
        """
        self._monitor.phase("optimizer step")
        verdict = self._guard.check(collective, self._stop_signal())
        if verdict.nonfinite:
            self._skip_nonfinite(verdict.nonfinite)
        else:
            self._update_weights()
        self.step += 1
        self._monitor.next_step(self.step + 1)
        self._monitor.step_done(self.model, self.step)
        return verdict.stop

    def _update_weights(self) -> None:
        if self.clip_grad_norm is not None:
            self.precision.unscale(self.optimizer)  # clip the true gradients, not scaled ones
            # After DDP's all-reduce every rank holds the same averaged gradients, so the
            # local norm is the global one; FSDP's sharded gradients are DTensors, whose
            # norm torch computes over all shards.
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
        self.precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None and self.scheduler_interval == "step":
            self.scheduler.step()

    def _skip_nonfinite(self, ranks: dict[int, str]) -> None:
        """Raise (the default), or drop this step's gradients on every rank."""
        if self._guard.policy == "error":
            raise NonFiniteLossError(step=self.step + 1, epoch=self.epoch + 1, ranks=ranks)
        self.optimizer.zero_grad(set_to_none=True)
        self.skipped_steps += 1
        where = ", ".join(f"{value} on rank {rank}" for rank, value in sorted(ranks.items()))
        logger.info(f"skipped step {self.step + 1}: loss is {where} ({self.skipped_steps} "
               "skipped so far)")  # fmt: skip

    def _stop_signal(self) -> int:
        return self._signals.signum if self._signals is not None else 0

    def _announce(self, loader: Iterable[Any], setup: dict[str, Any]) -> None:
        """Say once how the run is set up; seed the per-rank random streams."""
        if not self._announced:
            logger.info(describe_training(self, loader))
            report("setup", **setup)
            self._announced = True
        seed = configured_seed()
        if seed is not None:  # augmentation and dropout differ per rank, reproducibly
            seed_rank_streams(seed, self.world.rank)


def _group_size(index: int, total: int | None, accumulate: int) -> int:
    """Micro-batches in the accumulation group of batch ``index`` (the last may be short)."""
    if total is None:
        return accumulate
    return min(accumulate, total - (index - index % accumulate))
