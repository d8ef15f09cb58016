"""The training loop, once: ``TrainLoop``, which a hand-written loop drives and the Trainer is.

A hand-written loop (Fabric's and Accelerate's way) gives it what to checkpoint, iterates
through it and marks the backward and the update (docs/training.md); ``Trainer.fit`` is this
loop with a step. Both faces get the same steps: exact resume (mid-epoch, at any world size),
stop signals, the NaN/inf guard, accumulation, precision, uneven ranks under ``Join``, the
watchdog, exact evaluation, the epoch line, the step-time breakdown, logs, callbacks,
``ddpkit verify``. A checkpoint is taken once the body that called ``optimizer_step`` has
finished (a scheduler's ``step()`` after it too).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from ddpkit._core.validate import check_positive_int
from ddpkit.checkpoint.archives import archive_store
from ddpkit.compiling.keptkernels import CompiledRun, kernels_for_run
from ddpkit.data.epochs import Loaded, LoaderFacts, generator_state, open_epoch
from ddpkit.errors import ConfigError
from ddpkit.observe.benchreport import BenchReport
from ddpkit.observe.explog import experiment_logs, log_metrics
from ddpkit.observe.observer import RunObserver
from ddpkit.observe.profiling.profiler import profile_folder
from ddpkit.observe.profiling.spec import ProfileSpec
from ddpkit.observe.runsetup import RunSetup
from ddpkit.observe.steptime import Phase
from ddpkit.observe.trainjobstatus import RunPosition, TrainJobStatus
from ddpkit.runtime.callbacks import REGISTERED, Callback, Events
from ddpkit.runtime.position import LOOP_BODY, OPTIMIZER_STEP
from ddpkit.runtime.seeding import configured_seed, seed_rank_streams
from ddpkit.runtime.session import current_world
from ddpkit.train.checkpointer import Checkpointer, record_training_start
from ddpkit.train.evaluation import EvaluationParts, evaluate
from ddpkit.train.guard import StepGuard, even_epoch, join_unless
from ddpkit.train.monitor import StepMonitor
from ddpkit.train.options import LoopKeywords, RunOptions, shows_loop_keywords
from ddpkit.train.precision import MixedPrecision, check_agrees
from ddpkit.train.progress import EpochProgress, say_already_trained
from ddpkit.train.snapshots import MemorySnapshots, resume_from_memory
from ddpkit.train.state import RunState
from ddpkit.train.steps import StepOutput
from ddpkit.train.stop import Stop, StopSignals, leave, preempted
from ddpkit.train.update import Updater

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11's; annotations are not evaluated on 3.10

_NO_SIGNALS = StopSignals(enabled=False)  # never entered: its signum stays 0


class TrainLoop:
    """The training loop and its parts. ``state`` names what to checkpoint (models, optimizers,
    other entries: :mod:`ddpkit.train.state`); the keywords, the Trainer's too, are
    :class:`~ddpkit.train.options.LoopKeywords` (an unknown one is refused by name).

    Example:
        >>> import torch, ddpkit
        >>> _ = ddpkit.init()
        ddpkit: world size 1 ...
        >>> model = ddpkit.prepare_model(torch.nn.Linear(2, 1))
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> data = torch.utils.data.TensorDataset(torch.ones(4, 2), torch.zeros(4, 1))
        >>> loop = TrainLoop({"model": model, "optimizer": opt})
        >>> for epoch in loop.epochs(2):  # doctest: +ELLIPSIS
        ...     for x, y in loop.batches(ddpkit.prepare_loader(data, batch_size=2)):
        ...         with loop.autocast():  # the run's precision; fp32: nothing
        ...             loss = torch.nn.functional.mse_loss(model(x), y)
        ...         loop.backward(loss)  # the NaN/inf check, accumulation, loss scaling
        ...         _ = loop.optimizer_step(opt)  # the guard's verdict, step, zero_grad
        ddpkit: training an unwrapped model; global batch 2 = 2 per device x 1 rank; lr 0.1; fp32
        epoch 1/2  loss ... epoch 2/2  loss ...
        >>> loop.step, loop.epoch
        (4, 2)
        >>> ddpkit.shutdown()
    """

    @shows_loop_keywords
    def __init__(
        self,
        state: dict[str, Any],
        checkpoint_dir: str | os.PathLike[str] | None = None,
        *,
        callbacks: Sequence[Callback] = (),
        **options: Unpack[LoopKeywords],
    ) -> None:
        run_options = RunOptions.of("TrainLoop", checkpoint_dir, options)
        self._assemble(RunState.from_dict(state), run_options, callbacks)

    @classmethod
    def from_options(cls, run: RunState, options: RunOptions, callbacks: Sequence[Callback] = (),
                     owner: Any = None) -> TrainLoop:  # fmt: skip
        """The loop over ``run`` with ``options``, as the Trainer builds it; ``owner``: what
        every hook receives first (default: the loop).

        Example::

            TrainLoop.from_options(run, RunOptions.of("Trainer", None, {}), owner=trainer)
        """
        loop = cls.__new__(cls)
        loop._assemble(run, options, callbacks, owner)
        return loop

    def _assemble(self, run: RunState, run_options: RunOptions, callbacks: Sequence[Callback],
                  owner: Any = None) -> None:  # fmt: skip
        saving, options, logging = run_options.saving, run_options.loop, run_options.logging
        self.run, self.options, self.world = run, options, current_world()
        sharded = run.strategy.sharded
        check_agrees(options.precision, run.strategy)  # one precision, said in one place
        self.precision = MixedPrecision(options.precision, self.world.device, sharded=sharded)
        self.guard = StepGuard(options.nonfinite_loss, exchange_stops=saving.enabled)
        self.updater = Updater(run, self.precision, self.guard, options)
        self.checkpointer = Checkpointer(saving) if saving.enabled else None
        self.snapshots = MemorySnapshots.from_environment(sharded)  # each step, in memory
        self.explog = experiment_logs(logging.log_dir, logging.loggers)
        # rank 0 tells a Kubeflow TrainJob's status how far the run is, when it runs in one
        status = TrainJobStatus.from_environment(os.environ, self.position)
        builtins = [BenchReport(), *(c for c in (self.explog, status) if c is not None)]
        self.events = Events(callbacks, builtins, owner=owner or self)
        # The per-batch hooks are called where a callback has them (a call a batch saved
        # each, about 3 us in a GPT-2 step's cold caches: benchmarks/loop_parts.py)
        self._on_batch_start = self.events.listens("on_train_batch_start")
        self._on_batch_end = self.events.listens("on_train_batch_end")
        self.monitor = StepMonitor(run.model, options.check_replicas_every, self.events)
        # where the loop stands, for the hang watchdog: written at each stage, not told
        self._position, self._backward_stages = self.monitor.position, self.monitor.backward_stages
        self.observer = RunObserver(
            run.models.values(), self.world.device, logging.log_every,
            ProfileSpec.of(logging.profile), profile_folder(logging.log_dir),
        )  # fmt: skip
        self.clock = self.observer.clock  # where steps' time goes: the loop marks each phase
        self.setup: RunSetup | None = None  # how the run is set up, once it started
        self.loader: Any = None  # the loader of the epoch in progress
        self._facts: LoaderFacts | None = None  # what the run asks of it, read as it opened
        self.stopped: Stop | None = None  # why the last run ended early (None: it did not)
        self._epochs, self._started = 0, False
        self._epoch_running: int | None = None  # the epoch whose body runs
        self._progress: EpochProgress | None = None
        self._signals = _NO_SIGNALS  # outside epochs(): none caught, signum 0
        self._even = True  # every rank has as many batches this epoch
        self._added: dict[str, float] = {}  # the epoch's metrics from outside its batches
        self._compiled: CompiledRun | None = None  # a compiled model's run, to its first step

    model = property(lambda self: self.run.model, doc="The model (several: a ModelGroup).")
    models = property(lambda self: self.run.models, doc="The models by name.")
    optimizers = property(lambda self: self.run.optimizers, doc="Every optimizer, by name.")
    epoch = property(lambda self: self.run.epoch, doc="Completed epochs.")
    step = property(lambda self: self.run.step, doc="Optimizer steps taken.")
    history = property(lambda self: self.run.history, doc="Each completed epoch's metrics.")
    skipped_steps = property(lambda self: self.run.skipped_steps, doc="Steps skipped (NaN/inf).")

    def position(self) -> RunPosition:
        """Where the run stands: the epoch in progress (from 0) of how many, its batches done
        of how many, and whether it stopped early."""
        progress = self._progress
        epoch = progress.epoch if progress is not None else self.run.epoch
        done = progress.batches if progress is not None else 0
        total = progress.total if progress is not None else None
        return RunPosition(epoch, max(1, self._epochs), done, total, self.stopped is not None)

    def epochs(self, epochs: int, loader: Iterable[Any] | None = None) -> Iterator[int]:
        """The epochs still to train, from 0; resumes first (after a restart from the last
        step kept in memory, else from the newest checkpoint).

        After each epoch's body (your evaluation included) the epoch's line is shown and its
        checkpoint written when one is due. ``loader``: the training loader, if known now.
        """
        check_positive_int("epochs", epochs)
        self._epochs, self._started, self.stopped = epochs, False, None
        self._progress = self._resumed()
        # Augmentation and dropout differ per rank, reproducibly (a resumed epoch: its own).
        seed_rank_streams(configured_seed(), self.world.rank)
        if loader is not None:
            self._start(loader)
        if self.run.epoch >= epochs:
            say_already_trained(self.run.epoch, epochs)
        with StopSignals(enabled=self.checkpointer is not None) as self._signals:
            while self.run.epoch < epochs:
                epoch = self.run.epoch
                self._epoch_running, self._added = epoch, {}
                yield epoch
                # run.epoch, not epoch: a replica group that healed mid-epoch took its peer's
                self._end_epoch(self.run.epoch, ran=epoch)
        self._epoch_running, self._signals = None, _NO_SIGNALS
        self._finish(None)

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """This epoch's batches of ``loader``, on the rank's device; a resumed epoch starts
        after the batches it had done. Call it inside ``for epoch in loop.epochs(N)``."""
        progress, total, loaded = self._open_epoch(loader)
        updater = self.updater  # per batch, each call costs about a microsecond (cold caches)
        with join_unless(self._even, self.run.model), self.monitor.ending():
            fetched = self.monitor.batches(loaded, clock=self.clock)
            for index, batch in enumerate(fetched, start=progress.batches):
                if self._on_batch_start or REGISTERED:
                    self.events.call("on_train_batch_start", batch.batch)
                if updater.per_batch:  # accumulation or replica groups: else nothing to decide
                    updater.begin(index, total, batch.last)
                self._position.stage = LOOP_BODY
                self.clock.enter(Phase.COMPUTE)
                if updater.final:  # the group's last batch (most): no context to enter
                    yield batch.on_device
                else:
                    with updater.gradient_sync():
                        yield batch.on_device
                self._end_batch(progress, batch, index)
        progress.end()

    def _open_epoch(
        self, loader: Iterable[Any]
    ) -> tuple[EpochProgress, int | None, Iterator[Loaded]]:
        """The epoch's progress, how many batches it has, and its batches from where it
        stands (the one visit to ``data/`` an epoch); the ranks agree whether it is even,
        and the epoch's hooks are told it started."""
        if self._epoch_running is None:
            raise ConfigError(
                "TrainLoop.batches(loader) runs inside 'for epoch in loop.epochs(N):'"
            )
        self._start(loader)
        progress = EpochProgress.of(self._epoch_running, resumed=self._progress)
        self._progress = progress
        opened = open_epoch(loader, progress.start())
        loaded = opened.loaded(self.world.device)
        progress.opened(opened)
        self.loader, self._facts = loader, opened.facts
        self.events.call("on_train_epoch_start", progress.epoch + 1)
        self.observer.epoch_started(progress.epoch, self._epochs, opened.total, progress.batches)
        self._even = even_epoch(
            self.run.model, opened.facts.ranks_in_step, opened.total,
            self.options.nonfinite_loss, progress.epoch, self._even,
        )  # fmt: skip
        self.updater.zero_grad()
        return progress, opened.total, loaded

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context your forward pass and loss run under (the run's ``precision``)."""
        return self.precision.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` with the NaN/inf check, the accumulation group's share and
        fp16's loss scaling; use it instead of ``loss.backward()``."""
        self._position.stage = self._backward_stages[self.updater.final]
        detached = self.updater.backward(loss)
        self.clock.backward_done()
        if self._progress is not None:
            self._progress.losses.append(detached)  # the batch's metric by default

    def optimizer_step(self, *optimizers: torch.optim.Optimizer) -> bool:
        """The guard's verdict, then ``opt.step()`` and ``opt.zero_grad()`` for each of
        ``optimizers`` (default: all). Every rank calls it alike (it may exchange flags with
        the others). Whether this was a step (``loop.step`` moves on; step your schedulers
        then): False before an accumulation group's last batch, where it does nothing, and
        for a step replica groups dropped."""
        self._position.stage = OPTIMIZER_STEP
        self.clock.enter(Phase.OPTIMIZER)
        chosen = list(optimizers) or list(self.run.optimizers.values())
        self.updater.optimizer_step(chosen, self._even, self._signals.signum)
        return self.updater.stepped

    def record(self, metrics: Mapping[str, Any], samples: Any = None) -> None:
        """This batch's metrics (each a mean over ``samples``, default the batch's size) for
        the epoch's line and history, instead of the loss given to backward."""
        if self._progress is None:
            raise ConfigError("TrainLoop.record(metrics) runs inside 'loop.batches(loader)'")
        self._progress.record(dict(metrics), samples)

    def evaluate(
        self, loader: Iterable[Any], step: Callable[[Any], StepOutput]
    ) -> dict[str, float]:
        """``step(batch)``'s metrics (a loss, or a dict of means) over every rank's shard of
        ``loader``, exact despite the sampler's padding; the models in eval mode meanwhile;
        then ``on_validation_end``. Every rank calls it (:mod:`ddpkit.train.evaluation`).

        Example::

            val = loop.evaluate(val_loader, lambda b: F.cross_entropy(model(b[0]), b[1]))
            loop.add_metrics({f"val_{k}": v for k, v in val.items()})
        """
        parts = EvaluationParts(self.world.device, self.monitor, self.autocast, self.models)
        metrics = evaluate(loader, step, parts)
        self.events.call("on_validation_end", metrics)
        return metrics

    def add_metrics(self, metrics: Mapping[str, float]) -> None:
        """Metrics of the epoch in progress (a validation's), for its line and history."""
        self._added.update(metrics)

    def log(self, metrics: Mapping[str, Any]) -> None:
        """Log ``metrics`` (numbers or one-element tensors) at the current step to the
        logs of ``log_dir`` and ``loggers`` (rank 0; a resumed run continues the curves).

        Example::

            loop.log({"train/grad_norm": norm})
        """
        log_metrics(self.explog, metrics, self.run.step, self.updater.stepped)

    def state_dict(self, weights: bool = True) -> dict[str, Any]:
        """What a checkpoint holds: the run's state, the grad scaler, the callbacks' entries."""
        state = self._run_state(weights)
        self.events.call("on_save_checkpoint", state)
        return state

    def _run_state(self, weights: bool = True) -> dict[str, Any]:
        """The run's state and the grad scaler's."""
        return {**self.run.state_dict(weights), "grad_scaler": self.precision.state_dict()}

    def _memory_state(self) -> dict[str, Any]:
        """A memory snapshot's state, every step: the run's and the logs' (the callbacks'
        ``on_save_checkpoint`` comes with a checkpoint only: it may flush to a server)."""
        state = self._run_state()
        if self.explog is not None:
            self.explog.kept_in_memory(state)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; plain values go back into the state you gave."""
        self.run.load_state_dict(state)
        self.precision.load_state_dict(state["grad_scaler"])
        self.events.call("on_load_checkpoint", state)

    def resume(self) -> bool:
        """Load the newest valid checkpoint now, or after a restart the last step kept in
        memory (False: neither); ``epochs`` does it."""
        return self._resumed() is not None

    def _resumed(self) -> EpochProgress | None:
        """After a restart, the newest step every rank kept in memory; else the newest
        checkpoint (None: neither). The epoch to go on with."""
        progress = resume_from_memory(self.snapshots, self)  # every rank, with or without
        if progress is None and self.checkpointer is not None:
            progress = self.checkpointer.resume(self)
        return progress

    def _start(self, loader: Any) -> None:
        """Once per run, when the loader is known: say how it is set up, then the hooks."""
        if self._started:
            return
        self._started = True
        run, size = self.run, self.world.world_size
        strategy = run.strategy
        self.setup = RunSetup.of(
            strategy.name, run.optimizers, loader, size, self.options, strategy.layout,
            strategy.compute_precision,
        )  # fmt: skip
        self.monitor.next_step(self.run.step + 1)
        saver = self.checkpointer
        folder = saver.folder if saver is not None else None  # kernels kept before compiling
        local = folder.local if folder is not None else None
        self._compiled = kernels_for_run(
            run.models.values(), local, archive_store(folder), self.world.device
        )
        record_training_start(saver)
        self.observer.fit_started(self.setup, saver.resumed_batch if saver else None, run.step)
        self.events.call("on_fit_start")

    def _end_batch(self, progress: EpochProgress, batch: Loaded, index: int) -> None:
        """The batch's metrics summed, then at a step: the watchers, the hooks, the step's
        checkpoint when due or when any rank got a stop signal (the epoch's end writes one
        due at its last batch), then the stop the signal or the step limit asks for."""
        stepped, signal = self.updater.end_group()
        saver = self.checkpointer
        save = (
            stepped
            and saver is not None
            and (saver.due_after_step(self.run.step, batch.last, self._even) or signal is not None)
        )  # a due one never inside an uneven epoch: its ranks cannot meet there
        done = index + 1 if stepped else None
        metrics = progress.end_batch(batch.samples, self.guard.policy == "skip", done)
        part_way = progress.part_way() if save else None  # a collective, so only when saving
        limit = None
        if stepped:  # the watchers: the kept kernels, the clock, console and logs, watchdog
            if self._compiled is not None:
                self._first_step_done(self._compiled)
            self.clock.step_done()
            where = functools.partial(progress.where, self._epochs)
            self.observer.step_done(self.run.step, self._even, self._facts, where, metrics)
            self._position.step = self.run.step + 1  # the watchdog names the next step
            if self.monitor.watches_steps:  # the replica check, the step limit
                limit = self.monitor.step_done(self.run.model, self.run.step, self._even)
        else:  # a step's batch is counted with its step
            self.observer.batch_done()
        if self._on_batch_end or REGISTERED:
            self.events.call("on_train_batch_end", batch.batch, metrics)
        if stepped and self.snapshots is not None and self._even:  # after the hooks, as saves
            self.snapshots.take(self._memory_state(), progress, None)
        if saver is not None and part_way is not None:  # after the hooks: they saw the step
            path, position = saver.save_here(self, part_way, None)
            if signal:
                self._stop(preempted(signal, path, position.describe()))
        if limit is not None:
            self._stop(limit)

    def _first_step_done(self, compiled: CompiledRun) -> None:
        """A compiled model's first step is done: its kernels are kept for a restart."""
        compiled.first_step_done(self.world.rank)
        self._compiled = None

    def _end_epoch(self, epoch: int, ran: int) -> None:
        self.updater.step_schedulers("epoch")
        progress = self._progress if self._progress and self._progress.epoch == ran else None
        trained = self._epoch_totals(progress) if progress else {}
        metrics = {"epoch": float(epoch + 1), **trained, **self._added}
        self.run.epoch = epoch + 1
        self.events.call("on_train_epoch_end", metrics)  # may add metrics
        self.run.history.append(metrics)
        self.observer.epoch_done(metrics, self._epochs, trained=progress is not None)
        signal = self.guard.epoch_end(self._signals.signum)
        if signal:
            self._preempt(signal)
        if self.checkpointer and self.checkpointer.due_after_epoch(epoch + 1, self._epochs):
            self.checkpointer.save_here(self, None, generator_state(self.loader))
        if self.snapshots is not None:
            self.snapshots.take(self._memory_state(), None, generator_state(self.loader))

    def _epoch_totals(self, progress: EpochProgress) -> dict[str, float]:
        """The epoch's metrics and every rank's step times and memory: the ranks' metric sums
        travel in the all-gather that shares their times (one collective, not two)."""
        times, rows = self.observer.epoch_times(self._facts, carry=progress.sums.local_row())
        return {**progress.totals(rows), **times}

    def _preempt(self, signal: str) -> NoReturn:
        """A stop signal any rank got at an epoch's end: every rank saves here, then leaves
        with 75 (one inside the epoch saves at its step: :meth:`_end_batch`)."""
        assert self.checkpointer is not None  # stop signals are caught only with one
        generator = generator_state(self.loader)
        path, position = self.checkpointer.save_here(self, None, generator)
        self._stop(preempted(signal, path, position.describe()))

    def _finish(self, stop: Stop | None) -> None:
        """The end hooks, whether training completed or stopped early (``stop``)."""
        self._start(None)  # nothing ran (already trained): the start hooks still come first
        if self.checkpointer is not None:
            self.checkpointer.wait()  # a checkpoint written in the background is complete
        self.stopped = stop
        if self.snapshots is not None:
            self.snapshots.close()  # the copies to the next node ended, every rank together
        self.observer.close(finished=stop is None)
        self.events.call("on_fit_end")

    def _stop(self, stop: Stop) -> NoReturn:
        """Leave the loop for ``stop``: the end hooks run (logs flushed and closed), then the
        process ends, every rank together (the one exit point of ``train/``)."""
        self._finish(stop)
        leave(stop)
