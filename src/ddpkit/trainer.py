"""The training loop: epochs, sharded batches, metrics reduced over ranks, checkpoints, resume.

The loop is the same for one process and for N: the sampler is told the epoch, metrics are
summed over ranks as ``(loss * samples, samples, correct)`` so means are sample-weighted, the
progress bar and log lines come from rank 0 only, and rank 0 alone writes checkpoints. A new
``fit`` resumes from the newest checkpoint in ``checkpoint_dir`` by itself.

Example:
    >>> import torch, torch.nn.functional as F, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    >>> model = ddpkit.prepare_model(torch.nn.Linear(4, 2))
    >>> trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy)
    >>> loader = ddpkit.prepare_loader(data, batch_size=8)
    >>> history = trainer.fit(loader, epochs=1)  # doctest: +ELLIPSIS
    epoch 1/1 ...
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Sized
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from ddpkit.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from ddpkit.collectives import all_reduce_sum, is_main, print0
from ddpkit.data import batch_size_of, real_samples_on_rank, set_epoch
from ddpkit.errors import CheckpointError, ConfigError
from ddpkit.rendezvous import current_world
from ddpkit.strategy import unwrap_model

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
CHECKPOINT_FORMAT = "ddpkit.checkpoint/1"


class Trainer:
    """Trains a prepared model; rank 0 logs and checkpoints; resumes automatically.

    ``checkpoint_dir`` turns on checkpoints: one every ``save_every`` epochs and one at the
    end of ``fit`` (only the end when ``save_every`` is None). ``accumulate=K`` sums the
    gradients of K batches before each optimizer step, skipping DDP's all-reduce on the
    first K-1 (``no_sync``): the same step as one K-times larger batch. ``clip_grad_norm``
    clips by the global gradient norm before each step. Each holds the unwrapped
    model's ``state_dict`` (no ``module.`` prefix), the optimizer's, the epoch and the metrics.

    Example:
        >>> import torch, torch.nn.functional as F, ddpkit
        >>> _ = ddpkit.init()
        ddpkit: world size 1 ...
        >>> model = ddpkit.prepare_model(torch.nn.Linear(3, 2))
        >>> opt = torch.optim.Adam(model.parameters())
        >>> Trainer(model, opt, F.cross_entropy).epoch
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
    ) -> None:
        _check_positive("save_every", save_every)
        _check_positive("accumulate", accumulate)
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ConfigError(f"clip_grad_norm must be > 0 (got {clip_grad_norm!r})")
        self.accumulate = accumulate
        self.clip_grad_norm = clip_grad_norm
        if save_every is not None and checkpoint_dir is None:
            raise ConfigError("save_every needs a checkpoint_dir to save into")
        self.world = current_world()
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.checkpoint_dir = checkpoint_dir
        self.save_every = save_every
        self.epoch = 0  # completed epochs
        self.history: list[dict[str, float]] = []

    def fit(
        self, train: Iterable[Any], epochs: int, val: Iterable[Any] | None = None
    ) -> list[dict[str, float]]:
        """Train until ``epochs`` epochs are complete (resuming if a checkpoint exists).

        Returns the per-epoch metrics: ``loss`` (sample-weighted over all ranks), ``accuracy``
        for classifiers, ``time_s``, and ``val_*`` when ``val`` is given.

        Example:
            >>> trainer.fit(train_loader, epochs=10, val=val_loader)  # doctest: +SKIP
        """
        _check_positive("epochs", epochs)
        self._resume()
        if self.epoch >= epochs:
            print0(f"ddpkit: already trained {self.epoch} of {epochs} epochs; nothing to do")
        for epoch in range(self.epoch, epochs):
            metrics = {"epoch": float(epoch + 1), **self._train_epoch(train, epoch, epochs)}
            if val is not None:
                metrics.update({f"val_{k}": v for k, v in self.evaluate(val).items()})
            self.history.append(metrics)
            self.epoch = epoch + 1
            print0(_format_epoch(metrics, epochs))
            self._maybe_save(epochs)
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
        sums = _MetricSums(self.world.device)
        remaining = real_samples_on_rank(loader)  # padded duplicates are not counted
        for batch in loader:
            inputs, targets = self._to_device(batch)
            outputs = self.model(inputs)
            if remaining is not None:
                keep = max(0, min(len(targets), remaining))
                outputs, targets, remaining = outputs[:keep], targets[:keep], remaining - keep
            if len(targets):
                sums.add(self.loss_fn(outputs, targets), outputs, targets)
        return sums.reduce()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: model (unwrapped), optimizer, epoch, metrics.

        Example:
            >>> sorted(trainer.state_dict())  # doctest: +SKIP
            ['epoch', 'format', 'history', 'model', 'optimizer', 'world_size']
        """
        return {
            "format": CHECKPOINT_FORMAT,
            "epoch": self.epoch,
            "model": unwrap_model(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "history": list(self.history),
            "world_size": self.world.world_size,
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
        self.epoch = int(state["epoch"])
        self.history = list(state.get("history", []))

    def _train_epoch(self, loader: Iterable[Any], epoch: int, epochs: int) -> dict[str, float]:
        set_epoch(loader, epoch)  # type: ignore[arg-type]
        self.model.train()
        sums = _MetricSums(self.world.device)
        start = time.perf_counter()
        total = len(loader) if isinstance(loader, Sized) else None
        self.optimizer.zero_grad(set_to_none=True)
        for index, batch in enumerate(_progress(loader, f"epoch {epoch + 1}/{epochs}")):
            inputs, targets = self._to_device(batch)
            group = _group_size(index, total, self.accumulate)
            final = (index + 1) % self.accumulate == 0 or index + 1 == total
            with self._gradient_sync(final):
                outputs = self.model(inputs)
                loss = self.loss_fn(outputs, targets)
                (loss / group).backward()  # type: ignore[no-untyped-call]
            if final:
                self._optimizer_step()
            sums.add(loss.detach(), outputs.detach(), targets)
        return {**sums.reduce(), "time_s": time.perf_counter() - start}

    def _gradient_sync(self, final: bool) -> contextlib.AbstractContextManager[Any]:
        """All-reduce gradients only on the last micro-step of an accumulation group."""
        if final or not isinstance(self.model, DistributedDataParallel):
            return contextlib.nullcontext()
        return self.model.no_sync()

    def _optimizer_step(self) -> None:
        if self.clip_grad_norm is not None:
            # After DDP's all-reduce every rank holds the same averaged gradients, so the
            # norm computed locally is the global norm.
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _to_device(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not (isinstance(batch, (list, tuple)) and len(batch) == 2):
            raise ConfigError(
                f"Trainer expects each batch to be (inputs, targets); got a {type(batch).__name__}"
                + (f" of length {len(batch)}" if isinstance(batch, (list, tuple)) else "")
            )
        device = self.world.device
        return batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)

    def _resume(self) -> None:
        if self.checkpoint_dir is None:
            return
        path = latest_checkpoint(self.checkpoint_dir)
        if path is None:
            return
        self.load_state_dict(load_checkpoint(path, map_location=self.world.device))
        print0(f"ddpkit: resumed from {path} (epoch {self.epoch})")

    def _maybe_save(self, epochs: int) -> None:
        if self.checkpoint_dir is None:
            return
        periodic = self.save_every is not None and self.epoch % self.save_every == 0
        if not (periodic or self.epoch == epochs):
            return
        if self.world.is_main:  # replicas are identical under DDP: one writer is enough
            path = save_checkpoint(self.state_dict(), self.checkpoint_dir, self.epoch)
            print(f"ddpkit: saved {path}", flush=True)


class _MetricSums:
    """Per-rank running sums, kept on the device so the loop never waits for ``.item()``."""

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss*n, n, correct
        self.classifier: bool | None = None

    def add(self, loss: torch.Tensor, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        """Add one batch; ``loss`` is the batch mean, as torch's losses return by default."""
        n = batch_size_of(targets)
        if self.classifier is None:
            self.classifier = _is_classification(outputs, targets)
        self.sums[0] += loss.double() * n
        self.sums[1] += n
        if self.classifier:
            self.sums[2] += (outputs.argmax(dim=1) == targets).sum()

    def reduce(self) -> dict[str, float]:
        loss_sum, count, correct = all_reduce_sum(self.sums).tolist()
        if count == 0:
            return {}
        metrics = {"loss": loss_sum / count}
        if self.classifier:
            metrics["accuracy"] = correct / count
        return metrics


def _is_classification(outputs: torch.Tensor, targets: torch.Tensor) -> bool:
    return (
        outputs.dim() == 2
        and targets.dim() == 1
        and not torch.is_floating_point(targets)
        and outputs.shape[0] == targets.shape[0]
    )


def _progress(loader: Iterable[Any], desc: str) -> Iterable[Any]:
    # disable=None lets tqdm hide itself when stderr is not a terminal (CI logs, pipes).
    bar: Iterable[Any] = tqdm(loader, desc=desc, leave=False, disable=None if is_main() else True)
    return bar


def _format_epoch(metrics: dict[str, float], epochs: int) -> str:
    parts = [f"epoch {int(metrics['epoch'])}/{epochs}"]
    parts += [f"{k} {v:.4f}" for k, v in metrics.items() if k not in ("epoch", "time_s")]
    parts.append(f"({metrics['time_s']:.2f} s)")
    return "  ".join(parts)


def _group_size(index: int, total: int | None, accumulate: int) -> int:
    """Micro-batches in the accumulation group of batch ``index`` (the last may be short)."""
    if total is None:
        return accumulate
    return min(accumulate, total - (index - index % accumulate))


def _check_positive(name: str, value: int | None) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer (got {value!r})")
