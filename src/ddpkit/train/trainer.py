"""The training loop: epochs, sharded batches, metrics reduced over ranks, checkpoints, resume.

The loop is the same for one process and for N: the sampler is told the epoch, each batch is
moved to the rank's device whatever its structure, the step's metrics are summed over ranks
sample-weighted, the progress bar and log lines come from rank 0 only, and rank 0 alone writes
checkpoints (under FSDP every rank writes its shards). A new ``fit`` resumes from the newest
valid checkpoint in ``checkpoint_dir`` by itself, part-way through an epoch included (see
:mod:`ddpkit.train.resume`). Before each optimizer step the step guard
(:mod:`ddpkit.train.guards`) checks the loss and lets every rank agree on stop requests
(SIGTERM / SIGUSR1: checkpoint and exit 75, see :mod:`ddpkit.train.preemption`). When ranks
have different numbers of batches, the loop runs under torch's ``Join`` so the ranks that
finish first keep answering the others' all-reduces instead of leaving them to hang.

What a step receives and returns is :mod:`ddpkit.train.steps`'s contract; the default is the
classifier's ``loss_fn(model(inputs), targets)``.

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

import os
from collections.abc import Iterable, Mapping, Sequence, Sized
from typing import Any

import torch
from torch import nn

from ddpkit._core.log import logger
from ddpkit._core.validate import SchedulerInterval, check_positive_int, check_training_options
from ddpkit.data.batches import batch_size_of, slice_batch, to_device
from ddpkit.data.loader import real_samples_on_rank
from ddpkit.data.stream import StreamLoader
from ddpkit.errors import ConfigError
from ddpkit.parallel.group import ModelGroup
from ddpkit.parallel.strategy import strategy_of
from ddpkit.runtime.collectives import print0
from ddpkit.runtime.reporting import report
from ddpkit.runtime.seeding import configured_seed, seed_rank_streams
from ddpkit.runtime.session import current_world
from ddpkit.train.callbacks import Callback, Callbacks
from ddpkit.train.explog import experiment_log
from ddpkit.train.guards import NonFiniteLoss, StepGuard
from ddpkit.train.metrics import MetricSums, format_epoch
from ddpkit.train.monitor import StepMonitor, backward_label
from ddpkit.train.precision import MixedPrecision, Precision
from ddpkit.train.preemption import StopSignals
from ddpkit.train.progress import EpochProgress
from ddpkit.train.resume import Checkpointer
from ddpkit.train.startup import describe_training, setup_record
from ddpkit.train.steplog import StepLog, progress_bar
from ddpkit.train.steps import (
    LossFn,
    StepFn,
    StepOutput,
    StepResult,
    classifier_step,
    read_step_output,
)
from ddpkit.train.uneven import join_unless, same_batch_count
from ddpkit.train.updates import Updates


class Trainer(Updates):
    """Trains prepared models; rank 0 logs and checkpoints; resumes automatically.

    **The step.** By default a batch is ``(inputs, targets)`` and the loss is
    ``loss_fn(model(inputs), targets)``. Give ``training_step=fn`` (``fn(batch) -> loss |
    dict | None``) or override :meth:`training_step` / :meth:`validation_step` in a subclass
    for anything else: dict batches, ``model(**batch).loss``, several models. Batches reach
    the step on the rank's device, whatever their structure. A step that returns a dict
    reports every entry as a metric; see :mod:`ddpkit.train.steps`. A step that updates its
    models itself (a GAN) calls :meth:`backward` and :meth:`optimizer_step`.

    **Models and state.** ``model`` and ``optimizer`` may be mappings by name
    (``{"G": gen, "D": disc}``); ``scheduler`` too. ``state={...}`` adds your own entries to
    every checkpoint (see :mod:`ddpkit.train.stateful`); ``callbacks=[...]`` hook into the
    loop (:mod:`ddpkit.train.callbacks`).

    **Checkpoints.** ``checkpoint_dir`` turns them on: one every ``save_every`` epochs and/or
    every ``save_every_steps`` optimizer steps, and one at the end of ``fit``; only the newest
    ``keep_last`` are kept (None: all). A checkpoint taken part-way through an epoch resumes
    at the same batch with the same random state, so a job stopped and resumed ends with the
    parameters of an uninterrupted one. With a ``checkpoint_dir``, SIGTERM or SIGUSR1 during
    ``fit`` checkpoints at the next step and exits with code 75. Checkpoints hold the
    unwrapped models (no ``module.`` prefix), optimizers, schedulers, grad scaler, epoch,
    step, metrics, your ``state`` and every rank's random state.

    **Options.** ``nonfinite_loss="error"`` stops at a NaN/inf loss naming the step and rank,
    before that rank's update; ``"skip"`` skips such steps on every rank. ``accumulate=K``
    sums the gradients of K batches before each optimizer step, skipping the gradient
    all-reduce on the first K-1 (DDP's ``no_sync``). ``clip_grad_norm`` clips by the global
    gradient norm before each step. ``precision`` is ``"fp32"``, ``"bf16"`` (autocast, CPU or
    GPU) or ``"fp16"`` (autocast + loss scaling, GPU). Schedulers are stepped after every
    optimizer step (``scheduler_interval="step"``) or every epoch (``"epoch"``).
    ``check_replicas_every=M`` compares the DDP replicas across ranks every M steps (see
    :mod:`ddpkit.parallel.replicas`). ``log_every=N`` prints a line every N steps;
    ``log_dir`` writes TensorBoard event files and a CSV from rank 0 (:mod:`ddpkit.train.explog`).
    Each batch is watched by the hang watchdog (``ddpkit.init(hang_timeout=...)``).

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
        model: nn.Module | Mapping[str, nn.Module],
        optimizer: torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer],
        loss_fn: LossFn | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        save_every: int | None = None,
        *,
        training_step: StepFn | None = None,
        validation_step: StepFn | None = None,
        state: dict[str, Any] | None = None,
        callbacks: Sequence[Callback] = (),
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
        log_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        checkpoints = Checkpointer.configured(
            checkpoint_dir, save_every, save_every_steps, keep_last
        )
        check_training_options(accumulate, clip_grad_norm, check_replicas_every, scheduler_interval)
        if log_every is not None:
            check_positive_int("log_every", log_every)
        super().__init__(model, optimizer, scheduler, state)
        self.world = current_world()
        self.model = self.models["model"] if not isinstance(model, Mapping) else ModelGroup(model)
        self.loss_fn = loss_fn
        self._training_fn = training_step
        self._validation_fn = validation_step
        self._check_step_given()
        self.checkpoints = checkpoints
        self.callbacks = Callbacks([*callbacks, *experiment_log(log_dir)])
        self.accumulate = accumulate
        self.clip_grad_norm = clip_grad_norm
        self.strategy = strategy_of(self.model)  # what the loop, resume and checks ask of it
        self.precision = MixedPrecision(precision, self.world.device, sharded=self.strategy.sharded)
        self.scheduler_interval = scheduler_interval
        self._announced = False
        self._guard = StepGuard(nonfinite_loss, exchange_stops=checkpoints is not None)
        self._signals: StopSignals | None = None
        self._monitor = StepMonitor(self.model, check_replicas_every)
        self._log = StepLog(log_every)

    def fit(
        self, train: Iterable[Any], epochs: int, val: Iterable[Any] | None = None
    ) -> list[dict[str, float]]:
        """Train until ``epochs`` epochs are complete (resuming if a checkpoint exists).

        Returns the per-epoch metrics: the training step's (``loss``, and ``accuracy`` for
        classifiers), ``time_s``, and ``val_*`` when ``val`` is given.

        Example::

            trainer.fit(train_loader, epochs=10, val=val_loader)
        """
        check_positive_int("epochs", epochs)
        progress = self.checkpoints.resume(self, train) if self.checkpoints else None
        setup = setup_record(self, train)
        self._announce(train, setup)  # seeds the rank streams; a resumed epoch restores its own
        self._monitor.fit_started(self.model, setup, self.step)
        self.callbacks.call("on_fit_start", self)
        if self.epoch >= epochs:
            logger.info(
                f"already trained {self.epoch} of {epochs} epochs; nothing to do (ask for more "
                "epochs to continue, or move the checkpoints away to train again from scratch)"
            )
        with self._catching_stop_signals():
            for epoch in range(self.epoch, epochs):
                if progress is None or progress.epoch != epoch:  # else: the resumed epoch
                    progress = EpochProgress(epoch, train)
                self._run_epoch(train, progress, epochs, val)
        self._monitor.fit_finished(self.model, self.step)
        self.callbacks.call("on_fit_end", self)
        return self.history

    def training_step(self, batch: Any) -> StepOutput:
        """One training batch (on the device) -> a loss, a dict of metrics with ``"loss"``,
        or None after calling :meth:`backward` and :meth:`optimizer_step` yourself.

        Default: the ``training_step`` function given, else the classifier step. Override it
        in a subclass, or pass ``training_step=fn``.

        Example::

            class LMTrainer(ddpkit.Trainer):
                def training_step(self, batch):
                    return self.model(**batch).loss
        """
        if self._training_fn is not None:
            return self._training_fn(batch)
        assert self.loss_fn is not None  # checked at construction
        return classifier_step(self.model, self.loss_fn, batch)

    def validation_step(self, batch: Any) -> StepOutput:
        """One evaluation batch -> a dict of metrics (each a mean over the batch).

        Default: the ``validation_step`` function given; else the training step (without
        gradients) when it is your own, or the classifier step.

        Example::

            def validation_step(self, batch):
                loss = self.model(**batch).loss
                return {"loss": loss, "perplexity": loss.exp()}
        """
        if self._validation_fn is not None:
            return self._validation_fn(batch)
        if not self._custom_training():
            assert self.loss_fn is not None
            return classifier_step(self.model, self.loss_fn, batch)
        if self._manual:
            raise ConfigError(
                "this training_step updates the models itself (trainer.backward / "
                "optimizer_step), so it cannot double as the validation step: give the "
                "Trainer a validation_step"
            )
        return self.training_step(batch)

    def resume(self) -> bool:
        """Load the newest valid checkpoint of ``checkpoint_dir`` now; False when there is none.

        ``fit`` does this by itself; call it to evaluate a checkpoint without training.

        Example::

            trainer.resume() and trainer.evaluate(val_loader)
            # {'loss': 0.41, 'samples': 1000.0, 'accuracy': 0.88}
        """
        return self.checkpoints is not None and self.checkpoints.resume(self, None) is not None

    @torch.no_grad()
    def evaluate(self, loader: Iterable[Any]) -> dict[str, float]:
        """The validation step's metrics over every rank's shard of ``loader``.

        Exact over the whole dataset: samples the sampler repeated to even out the shards
        are left out, so the metrics are the ones a single process would compute.

        Example::

            trainer.evaluate(val_loader)   # {'loss': 0.08, 'samples': 36.0, 'accuracy': 0.97}
        """
        self.model.eval()
        sums = MetricSums(self.world.device)
        remaining = real_samples_on_rank(loader)  # padded duplicates are not counted
        with self._monitor.ending():
            for batch in self._monitor.batches(loader, evaluation=True):
                batch = to_device(batch, self.world.device)
                size = batch_size_of(batch)
                keep = size if remaining is None else max(0, min(size, remaining))
                remaining = None if remaining is None else remaining - keep
                self._monitor.phase("forward", evaluation=True)
                result = self._validation_batch(batch, size, keep)
                if result is not None:
                    sums.add(result.metrics, result.samples)
        metrics = sums.reduce()
        self.callbacks.call("on_validation_end", self, metrics)
        return metrics

    def _validation_batch(self, batch: Any, size: int, keep: int) -> StepResult | None:
        # Every rank runs every batch, a batch of padding only included: FSDP's forward
        # gathers parameters, DDP's may broadcast buffers. Padding is then not counted.
        part = slice_batch(batch, keep) if 0 < keep < size else batch
        with self.precision.autocast():
            output = self.validation_step(part)
        return read_step_output(output, part, "validation_step") if keep else None

    def _run_epoch(
        self, train: Iterable[Any], progress: EpochProgress, epochs: int, val: Any
    ) -> None:
        metrics = {"epoch": float(progress.epoch + 1), **self._train_epoch(train, progress, epochs)}
        if val is not None:
            metrics.update({f"val_{k}": v for k, v in self.evaluate(val).items()})
        self.epoch = progress.epoch + 1
        self.callbacks.call("on_train_epoch_end", self, metrics)  # may add metrics
        self.history.append(metrics)
        print0(format_epoch(metrics, epochs))
        report("epoch", **metrics)
        stop = self._guard.epoch_end(self._stop_signal())
        if self.checkpoints is not None:
            self.checkpoints.epoch_done(self, train, epochs, stop)

    def _train_epoch(
        self, loader: Iterable[Any], progress: EpochProgress, epochs: int
    ) -> dict[str, float]:
        batches = progress.batches_from(loader)  # tells the sampler the epoch
        self._monitor.epoch_started(loader)
        self.callbacks.call("on_train_epoch_start", self, progress.epoch + 1)
        self.model.train()
        total = len(loader) if isinstance(loader, Sized) else None
        self._zero_grad()
        bar = progress_bar(batches, total, progress.batches, f"epoch {progress.epoch + 1}/{epochs}")
        # A stream's loader keeps the ranks in step itself; other loaders are asked once.
        self._even = isinstance(loader, StreamLoader) or same_batch_count(
            self.model, total, self._guard.policy
        )
        with join_unless(self._even, self.model), self._monitor.ending():
            for index, batch in enumerate(self._monitor.batches(bar), start=progress.batches):
                # A stream has no total; its loader tells, one step ahead, when it ends.
                last = index + 1 == total or getattr(batches, "last", False)
                final = (index + 1) % self.accumulate == 0 or last
                result = self._train_batch(batch, index, total, final)
                progress.sums.add(result.metrics, result.samples)
                if final:
                    stop = self._finish_step()
                    progress.batches = index + 1
                    self._log.step_done(self.step, progress, epochs, total, result.metrics, bar)
                self.callbacks.call("on_train_batch_end", self, batch, result.metrics)
                if final and self.checkpoints is not None:  # after the hooks: they saw the step
                    self.checkpoints.step_done(self, progress, stop, last=last)
        self._step_schedulers("epoch")
        return {**progress.sums.reduce(), "time_s": progress.elapsed_s}

    def _train_batch(self, batch: Any, index: int, total: int | None, final: bool) -> StepResult:
        """The step on one batch, then its backward unless the step did its own."""
        batch = to_device(batch, self.world.device)
        self._monitor.phase("forward")
        self._manual = False
        with self._gradient_sync(final):
            with self.precision.autocast():
                output = self.training_step(batch)
            result = read_step_output(output, batch, "training_step", needs_loss=not self._manual)
            if not self._manual:
                assert result.loss is not None
                self._guard.note_loss(result.loss)
                self._monitor.phase(backward_label(final, self.world.world_size))
                self.precision.backward(result.loss / _group_size(index, total, self.accumulate))
        return result

    def _custom_training(self) -> bool:
        return (
            self._training_fn is not None or type(self).training_step is not Trainer.training_step
        )

    def _check_step_given(self) -> None:
        if self.loss_fn is None and not self._custom_training():
            raise ConfigError(
                "the Trainer needs a loss_fn for its default (inputs, targets) step, or a "
                "training_step: Trainer(model, opt, F.cross_entropy) or "
                "Trainer(model, opt, training_step=lambda batch: model(**batch).loss)"
            )
        if isinstance(self.model, ModelGroup) and not self._custom_training():
            raise ConfigError(
                f"with several models ({', '.join(self.models)}) the Trainer cannot guess the "
                "step: give it a training_step"
            )

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
