"""The Trainer: the training loop (:mod:`ddpkit.train.loop`) with a default step and evaluation.

``fit`` reads as the loop it runs: the loop's epochs (resuming first), each batch's step
(forward under the run's precision, then the loop's backward and optimizer step), then the
evaluation, whose metrics join the epoch's line. Everything else is the loop's, as for a
hand-written loop. A step's contract is :mod:`ddpkit.train.steps`'s.

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
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ddpkit.errors import ConfigError
from ddpkit.parallel.group import ModelGroup
from ddpkit.runtime.callbacks import Callback
from ddpkit.runtime.position import FORWARD
from ddpkit.train.loop import TrainLoop
from ddpkit.train.options import LoopKeywords, RunOptions, SchedulerInterval, shows_loop_keywords
from ddpkit.train.state import RunState
from ddpkit.train.steps import (
    LossFn,
    StepFn,
    StepOutput,
    classifier_step,
    read_step_output,
)

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11's; annotations are not evaluated on 3.10


class Trainer:
    """Trains prepared models; rank 0 logs and checkpoints; resumes automatically.

    **The step.** By default a batch is ``(inputs, targets)`` and the loss is
    ``loss_fn(model(inputs), targets)``. Give ``training_step=fn`` (``fn(batch) -> loss |
    dict``) or override :meth:`training_step` / :meth:`validation_step` in a subclass for
    anything else: dict batches, ``model(**batch).loss``, several models. A step that returns
    a dict reports every entry as a metric (:mod:`ddpkit.train.steps`). A step that updates
    its models itself (a GAN) is declared with ``manual_optimization=True`` and calls
    :meth:`backward` and :meth:`optimizer_step`.

    **Models and state.** ``model``, ``optimizer`` and ``scheduler`` may be mappings by name
    (``{"G": gen, "D": disc}``); ``state={...}`` adds your entries to every checkpoint.
    Checkpoints, options (``**options``: :class:`~ddpkit.train.options.LoopKeywords`, the
    same as ``TrainLoop``'s) and ``callbacks`` are the loop's; schedulers step per optimizer
    step (``scheduler_interval="step"``) or per epoch.

    Example::

        trainer = Trainer(model, opt, F.cross_entropy, "runs/x", save_every=5, precision="bf16")
    """

    @shows_loop_keywords
    def __init__(
        self,
        model: nn.Module | Mapping[str, nn.Module],
        optimizer: torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer],
        loss_fn: LossFn | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        *,
        training_step: StepFn | None = None,
        validation_step: StepFn | None = None,
        manual_optimization: bool = False,
        state: dict[str, Any] | None = None,
        callbacks: Sequence[Callback] = (),
        scheduler: Any = None,
        scheduler_interval: SchedulerInterval = "step",
        **options: Unpack[LoopKeywords],
    ) -> None:
        self.loss_fn = loss_fn
        self.manual_optimization = manual_optimization
        self._training_fn, self._validation_fn = training_step, validation_step
        run = RunState(model, optimizer, scheduler, state)
        run_options = RunOptions.of("Trainer", checkpoint_dir, options, scheduler_interval)
        self.loop = TrainLoop.from_options(run, run_options, callbacks, owner=self)
        self.model, self.models, self.world = run.model, run.models, self.loop.world
        self.optimizers, self.schedulers = run.optimizers, run.schedulers
        self.state = run.user_state
        self._check_step_given()

    def fit(
        self, train: Iterable[Any], epochs: int, val: Iterable[Any] | None = None
    ) -> list[dict[str, float]]:
        """Train until ``epochs`` epochs are complete (resuming if a checkpoint exists).

        Returns the per-epoch metrics: the training step's (``loss``, and ``accuracy`` for
        classifiers), ``time_s``, and ``val_*`` when ``val`` is given.

        Example::

            trainer.fit(train_loader, epochs=10, val=val_loader)
        """
        for _epoch in self.loop.epochs(epochs, train):
            self.model.train()
            for batch in self.loop.batches(train):
                self._train_batch(batch)
            if val is not None:
                self.loop.add_metrics({f"val_{k}": v for k, v in self.evaluate(val).items()})
        return self.loop.run.history

    def _train_batch(self, batch: Any) -> None:
        """The step on one batch; then, unless it updates the models itself, the loop's
        backward and optimizer step (the latter waits for an accumulation group's end)."""
        self.loop.monitor.stage(FORWARD)
        with self.loop.autocast():
            output = self.training_step(batch)
        manual = self.manual_optimization
        result = read_step_output(output, batch, "training_step", needs_loss=not manual)
        if not manual:
            assert result.loss is not None
            self.loop.backward(result.loss)
            self.loop.optimizer_step()
        self.loop.record(result.metrics, result.samples)

    def training_step(self, batch: Any) -> StepOutput:
        """One training batch (on the device) -> a loss, or metrics with ``"loss"`` (a manual
        step: metrics or None, after its own :meth:`backward` and :meth:`optimizer_step`).
        Default: the ``training_step`` function given, else the classifier step.

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
        """One evaluation batch -> a dict of metrics (each a mean over the batch). Default:
        the function given; else your training step (without gradients), or the classifier's.

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
        if self.manual_optimization:
            raise ConfigError(
                "this training_step updates the models itself (manual_optimization=True), so "
                "it cannot double as the validation step: give the Trainer a validation_step"
            )
        return self.training_step(batch)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` for a manual step: the loop's, with the NaN/inf check.

        Example::

            def training_step(self, batch):
                loss_d = ...
                self.backward(loss_d)
                self.optimizer_step(self.optimizers["D"])
        """
        self._check_manual("backward")
        self.loop.backward(loss)

    def optimizer_step(self, *optimizers: torch.optim.Optimizer) -> None:
        """Step ``optimizers`` (default: all) after the guard's verdict, for a manual step;
        every rank calls it as often as the others (it may exchange flags with them).

        Example::

            self.optimizer_step(self.optimizers["G"])
        """
        self._check_manual("optimizer_step")
        self.loop.optimizer_step(*optimizers)

    def evaluate(self, loader: Iterable[Any]) -> dict[str, float]:
        """The validation step's metrics over every rank's shard of ``loader``, exact: the
        samples the sampler repeated to even out the shards are left out (the loop's
        :meth:`~ddpkit.train.loop.TrainLoop.evaluate`).

        Example::

            trainer.evaluate(val_loader)   # {'loss': 0.08, 'samples': 36.0, 'accuracy': 0.97}
        """
        return self.loop.evaluate(loader, self.validation_step)

    def resume(self) -> bool:
        """Load the newest valid checkpoint now (False: none); ``fit`` does it by itself.

        Example::

            trainer.resume() and trainer.evaluate(val_loader)   # a checkpoint's metrics
        """
        return self.loop.resume()

    def state_dict(self, weights: bool = True) -> dict[str, Any]:
        """What a checkpoint holds (``weights=False``: no models and optimizers).

        Example::

            sorted(trainer.state_dict())   # ['epoch', 'format', 'grad_scaler', ...]
        """
        return self.loop.state_dict(weights)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output.

        Example::

            trainer.load_state_dict(ddpkit.checkpoint.load_checkpoint(path))
        """
        self.loop.load_state_dict(state)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer, when there is one (several: use ``optimizers[name]``)."""
        if len(self.optimizers) != 1:
            names = ", ".join(self.optimizers)
            raise ConfigError(f"{len(self.optimizers)} optimizers ({names}): use optimizers[name]")
        return next(iter(self.optimizers.values()))

    epoch = property(lambda self: self.loop.epoch, doc="Completed epochs.")
    step = property(lambda self: self.loop.step, doc="Optimizer steps taken.")
    history = property(lambda self: self.loop.history, doc="Every completed epoch's metrics.")
    skipped_steps = property(lambda self: self.loop.run.skipped_steps, doc="Steps skipped.")

    setup = property(lambda self: self.loop.setup, doc="How the run is set up (RunSetup).")
    loader = property(lambda self: self.loop.loader, doc="The loader of the epoch in progress.")
    stopped = property(lambda self: self.loop.stopped, doc="Why fit ended early (Stop | None).")

    def _check_manual(self, call: str) -> None:
        if not self.manual_optimization:
            raise ConfigError(
                f"the step called trainer.{call}(): a step that updates the models itself "
                "is declared with Trainer(..., manual_optimization=True); otherwise return "
                "the loss and the Trainer makes the backward and the optimizer step"
            )

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
