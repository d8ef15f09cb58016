"""The training loop: epochs, sharded batches, metrics reduced over ranks, checkpoints, resume.

The loop is the same for one process and for N: the sampler is told the epoch, metrics are
summed over ranks as ``(loss * samples, samples, correct)`` so means are sample-weighted, the
progress bar and log lines come from rank 0 only, and rank 0 alone writes checkpoints (under
FSDP every rank writes its shards). A new ``fit`` resumes from the newest checkpoint in
``checkpoint_dir`` by itself. When ranks have different numbers of batches, the loop runs
under torch's ``Join`` so the ranks that finish first keep answering the others' all-reduces
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
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from ddpkit.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from ddpkit.collectives import all_reduce_max, is_main, print0
from ddpkit.data import real_samples_on_rank, set_epoch
from ddpkit.errors import CheckpointError, ConfigError
from ddpkit.fsdp import is_sharded, no_gradient_sync
from ddpkit.metrics import MetricSums, format_epoch
from ddpkit.precision import MixedPrecision
from ddpkit.rendezvous import current_world
from ddpkit.reporting import report
from ddpkit.seeding import configured_seed, seed_rank_streams
from ddpkit.sharded import load_sharded, save_sharded
from ddpkit.startup import describe_training, setup_record
from ddpkit.stepmonitor import StepMonitor
from ddpkit.strategy import unwrap_model
from ddpkit.validate import check_choice, check_positive_int

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
CHECKPOINT_FORMAT = "ddpkit.checkpoint/1"


class Trainer:
    """Trains a prepared model; rank 0 logs and checkpoints; resumes automatically.

    ``checkpoint_dir`` turns on checkpoints: one every ``save_every`` epochs and one at the
    end of ``fit`` (only the end when ``save_every`` is None). ``accumulate=K`` sums the
    gradients of K batches before each optimizer step, skipping the gradient all-reduce on
    the first K-1 (DDP's ``no_sync``): the same step as one K-times larger batch.
    ``clip_grad_norm`` clips by the global gradient norm before each step. ``precision`` is
    ``"fp32"``, ``"bf16"`` (autocast, CPU or GPU) or ``"fp16"`` (autocast + loss scaling,
    GPU). ``scheduler`` is stepped after every optimizer step (``scheduler_interval="step"``)
    or every epoch (``"epoch"``). Checkpoints hold the unwrapped model (no ``module.``
    prefix), optimizer, scheduler, grad scaler, epoch, step and metrics.
    ``check_replicas_every=M`` compares the DDP replicas across ranks every M optimizer
    steps and stops with :class:`~ddpkit.errors.ReplicaDivergenceError`, naming the ranks
    and tensors that differ (see :mod:`ddpkit.replicas`). Each batch is watched by the hang
    watchdog (``ddpkit.init(hang_timeout=...)``).

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
        accumulate: int = 1,
        clip_grad_norm: float | None = None,
        precision: str = "fp32",
        scheduler: Any = None,
        scheduler_interval: str = "step",
        check_replicas_every: int | None = None,
    ) -> None:
        _check_options(checkpoint_dir, save_every, accumulate, clip_grad_norm)
        if check_replicas_every is not None:
            check_positive_int("check_replicas_every", check_replicas_every)
        check_choice("scheduler_interval", scheduler_interval, ("step", "epoch"))
        self.world = current_world()
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.checkpoint_dir = checkpoint_dir
        self.save_every = save_every
        self.accumulate = accumulate
        self.clip_grad_norm = clip_grad_norm
        self.precision = MixedPrecision(precision, self.world.device, sharded=is_sharded(model))
        self.scheduler = scheduler
        self.scheduler_interval = scheduler_interval
        self.epoch = 0  # completed epochs
        self.step = 0  # completed optimizer steps
        self.history: list[dict[str, float]] = []
        self._announced = False
        self._monitor = StepMonitor(model, check_replicas_every)

    def fit(
        self, train: Iterable[Any], epochs: int, val: Iterable[Any] | None = None
    ) -> list[dict[str, float]]:
        """Train until ``epochs`` epochs are complete (resuming if a checkpoint exists).

        Returns the per-epoch metrics: ``loss`` (sample-weighted over all ranks), ``accuracy``
        for classifiers, ``time_s``, and ``val_*`` when ``val`` is given.

        Example:
            >>> trainer.fit(train_loader, epochs=10, val=val_loader)  # doctest: +SKIP
        """
        check_positive_int("epochs", epochs)
        self._resume()
        self._announce(train)
        self._monitor.fit_started(self, train)
        if self.epoch >= epochs:
            print0(f"ddpkit: already trained {self.epoch} of {epochs} epochs; nothing to do")
        for epoch in range(self.epoch, epochs):
            metrics = {"epoch": float(epoch + 1), **self._train_epoch(train, epoch, epochs)}
            if val is not None:
                metrics.update({f"val_{k}": v for k, v in self.evaluate(val).items()})
            self.history.append(metrics)
            self.epoch = epoch + 1
            print0(format_epoch(metrics, epochs))
            report("epoch", **metrics)
            self._maybe_save(epochs)
        self._monitor.fit_finished(self, self.step)
        return self.history

    @torch.no_grad()
    def evaluate(self, loader: Iterable[Any]) -> dict[str, float]:
        """Mean loss (and accuracy for classifiers) over every rank's shard of ``loader``.

        Exact over the whole dataset: samples the sampler repeated to even out the shards
        are left out, so the metric is the one a single process would compute.

        Example:
            >>> trainer.evaluate(val_loader)  # doctest: +SKIP
            {'loss': 0.08, 'accuracy': 0.97}
        """
        self.model.eval()
        sums = MetricSums(self.world.device)
        remaining = real_samples_on_rank(loader)  # padded duplicates are not counted
        with _ending(self._monitor.batch_done):
            for batch in self._monitor.batches(loader, evaluation=True):
                inputs, targets = self._to_device(batch)
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

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: model (unwrapped), optimizer, scheduler, epoch, metrics.

        Example:
            >>> sorted(trainer.state_dict())  # doctest: +SKIP
            ['epoch', 'format', 'grad_scaler', 'history', 'model', 'optimizer', ...]
        """
        return {
            **self._loop_state(),
            "model": unwrap_model(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` output (for example a loaded checkpoint).

        Example:
            >>> trainer.load_state_dict(ddpkit.checkpoint.load_checkpoint(path))  # doctest: +SKIP
        """
        try:
            unwrap_model(self.model).load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (KeyError, RuntimeError, ValueError) as err:
            raise CheckpointError(
                f"checkpoint does not match this model/optimizer: {str(err).strip()[:500]}"
            ) from err
        self._load_loop_state(state)

    def _loop_state(self) -> dict[str, Any]:
        """The state beside the model and optimizer: plain data, small, written by rank 0."""
        return {
            "format": CHECKPOINT_FORMAT,
            "epoch": self.epoch,
            "step": self.step,
            "history": list(self.history),
            "world_size": self.world.world_size,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "grad_scaler": self.precision.state_dict(),
        }

    def _load_loop_state(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.step = int(state.get("step", 0))
        self.history = list(state.get("history", []))
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.precision.load_state_dict(state.get("grad_scaler") or {})

    def _train_epoch(self, loader: Iterable[Any], epoch: int, epochs: int) -> dict[str, float]:
        set_epoch(loader, epoch)  # type: ignore[arg-type]
        self._monitor.epoch_started(loader)
        self.model.train()
        sums = MetricSums(self.world.device)
        start = time.perf_counter()
        total = len(loader) if isinstance(loader, Sized) else None
        self.optimizer.zero_grad(set_to_none=True)
        batches = self._monitor.batches(_progress(loader, f"epoch {epoch + 1}/{epochs}"))
        with self._join_if_uneven(total), _ending(self._monitor.batch_done):
            for index, batch in enumerate(batches):
                final = (index + 1) % self.accumulate == 0 or index + 1 == total
                outputs, targets, loss = self._micro_step(batch, index, total, final)
                if final:
                    self._optimizer_step()
                sums.add(loss, outputs, targets)
        if self.scheduler is not None and self.scheduler_interval == "epoch":
            self.scheduler.step()
        return {**sums.reduce(), "time_s": time.perf_counter() - start}

    def _micro_step(
        self, batch: Any, index: int, total: int | None, final: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Forward and backward of one batch; returns detached outputs, targets, loss."""
        inputs, targets = self._to_device(batch)
        self._monitor.phase("forward")
        with self._gradient_sync(final):
            with self.precision.autocast():
                outputs = self.model(inputs)
                loss = self.loss_fn(outputs, targets)
            self._monitor.phase(_backward_label(final, self.world.world_size))
            self.precision.backward(loss / _group_size(index, total, self.accumulate))
        return outputs.detach(), targets, loss.detach()

    def _gradient_sync(self, final: bool) -> contextlib.AbstractContextManager[Any]:
        """All-reduce gradients only on the last micro-step of an accumulation group."""
        if final:
            return contextlib.nullcontext()
        if isinstance(self.model, DistributedDataParallel):
            return self.model.no_sync()
        if is_sharded(self.model):
            return no_gradient_sync(self.model)
        return contextlib.nullcontext()

    def _optimizer_step(self) -> None:
        self._monitor.phase("optimizer step")
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
        self.step += 1
        self._monitor.next_step(self.step + 1)
        self._monitor.step_done(self, self.step)

    def _join_if_uneven(self, total: int | None) -> contextlib.AbstractContextManager[Any]:
        """torch's Join when ranks hold different numbers of batches (or cannot tell)."""
        if self.world.world_size == 1:
            return contextlib.nullcontext()
        count = float(total if total is not None else -1)
        # One collective for both ends: the max of -count is minus the min.
        most, negated_fewest = all_reduce_max(torch.tensor([count, -count])).tolist()
        fewest = -negated_fewest
        if most == fewest and fewest >= 0:
            return contextlib.nullcontext()
        if is_sharded(self.model):
            raise ConfigError(
                f"FSDP needs the same number of batches on every rank, but ranks have between "
                f"{fewest:.0f} and {most:.0f} (-1: no length); shard with ddpkit.prepare_loader"
                " (uneven='pad' or 'drop'), or use strategy='ddp'"
            )
        if isinstance(self.model, DistributedDataParallel):
            return Join([self.model])
        return contextlib.nullcontext()  # no collectives inside the loop: nothing can hang

    def _to_device(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not (isinstance(batch, (list, tuple)) and len(batch) == 2):
            raise ConfigError(
                f"Trainer expects each batch to be (inputs, targets); got a {type(batch).__name__}"
                + (f" of length {len(batch)}" if isinstance(batch, (list, tuple)) else "")
            )
        device = self.world.device
        return batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)

    def _announce(self, loader: Iterable[Any]) -> None:
        """Say once how the run is set up; seed the per-rank random streams."""
        if not self._announced:
            print0(describe_training(self, loader))
            report("setup", **setup_record(self, loader))
            self._announced = True
        seed = configured_seed()
        if seed is not None:  # augmentation and dropout differ per rank, reproducibly
            seed_rank_streams(seed, self.world.rank)

    def _resume(self) -> None:
        if self.checkpoint_dir is None:
            return
        path = latest_checkpoint(self.checkpoint_dir)
        if path is None:
            return
        if path.suffix == ".dcp":  # sharded: every rank reads its own shards
            self._load_loop_state(load_sharded(self.model, self.optimizer, path))
        elif is_sharded(self.model):
            raise CheckpointError(
                f"{path} is a whole-model checkpoint but this model is sharded (FSDP); resume "
                "it with the strategy that wrote it, or start a new checkpoint_dir"
            )
        else:
            self.load_state_dict(load_checkpoint(path, map_location=self.world.device))
        print0(f"ddpkit: resumed from {path} (epoch {self.epoch})")

    def _maybe_save(self, epochs: int) -> None:
        if self.checkpoint_dir is None:
            return
        periodic = self.save_every is not None and self.epoch % self.save_every == 0
        if not (periodic or self.epoch == epochs):
            return
        if is_sharded(self.model):  # a collective: each rank writes its own shards
            path = save_sharded(
                self.model, self.optimizer, self._loop_state(), self.checkpoint_dir, self.epoch
            )
            print0(f"ddpkit: saved {path}")
        elif self.world.is_main:  # replicas are identical under DDP: one writer is enough
            path = save_checkpoint(self.state_dict(), self.checkpoint_dir, self.epoch)
            print(f"ddpkit: saved {path}", flush=True)


def _progress(loader: Iterable[Any], desc: str) -> Iterable[Any]:
    # disable=None lets tqdm hide itself when stderr is not a terminal (CI logs, pipes).
    bar: Iterable[Any] = tqdm(loader, desc=desc, leave=False, disable=None if is_main() else True)
    return bar


@contextlib.contextmanager
def _ending(callback: Callable[[], None]) -> Iterator[None]:
    # A batch generator left by an exception is not finalized at once: end its activity here.
    try:
        yield
    finally:
        callback()


def _backward_label(final: bool, world_size: int) -> str:
    if world_size == 1:
        return "backward"
    return "backward + gradient all-reduce" if final else "backward (no sync)"


def _group_size(index: int, total: int | None, accumulate: int) -> int:
    """Micro-batches in the accumulation group of batch ``index`` (the last may be short)."""
    if total is None:
        return accumulate
    return min(accumulate, total - (index - index % accumulate))


def _check_options(
    checkpoint_dir: object, save_every: int | None, accumulate: int, clip: float | None
) -> None:
    if save_every is not None:
        check_positive_int("save_every", save_every)
        if checkpoint_dir is None:
            raise ConfigError("save_every needs a checkpoint_dir to save into")
    check_positive_int("accumulate", accumulate)
    if clip is not None and not clip > 0:
        raise ConfigError(f"clip_grad_norm must be > 0 (got {clip!r})")
