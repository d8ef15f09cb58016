"""How far training is through the current epoch, so a checkpoint taken part-way resumes there.

An epoch's position is the batches each rank has finished, its metric sums so far, and the
loader's random generator as the epoch began (it seeds the DataLoader's workers). A resumed
epoch sets the same epoch on the sampler, puts the generator back, starts after the batches
done (ddpkit's sampler skips them unread; other loaders read and drop them), and restores the
rank's random generators before its first new batch: it ends as the uninterrupted one would.

Example:
    >>> import torch, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> data = torch.utils.data.TensorDataset(torch.arange(8.0))
    >>> loader = ddpkit.prepare_loader(data, batch_size=2, shuffle=False)
    >>> progress = EpochProgress(0)
    >>> progress.batches = 3              # three batches were done before the interruption
    >>> from ddpkit.data.epochs import open_epoch
    >>> opened = open_epoch(loader, progress.start())
    >>> progress.opened(opened)
    >>> [b[0].tolist() for b in opened.batches]
    [[6.0, 7.0]]
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import functools
import operator
import time
from dataclasses import dataclass
from typing import Any

import torch

from ddpkit._core.log import logger
from ddpkit.checkpoint.rngstate import restore_rng
from ddpkit.data.epochs import EpochStart, OpenedEpoch
from ddpkit.errors import ConfigError
from ddpkit.runtime.collectives import is_main
from ddpkit.runtime.session import current_world
from ddpkit.train.steps import MetricSums


@dataclass(frozen=True)
class PartWay:
    """A checkpoint's place inside an epoch: the progress's ``state`` (its
    :meth:`EpochProgress.state_dict`) and the loader generator's state the epoch began with.

    Example:
        >>> PartWay({"epoch": 0, "batches": 3}, None).state["batches"]
        3
    """

    state: dict[str, Any]
    generator_state: torch.Tensor | None


class EpochProgress:
    """One epoch in progress on this rank: batches done, metric sums, elapsed time.

    Example:
        >>> import ddpkit
        >>> _ = ddpkit.init()
        ddpkit: world size 1 ...
        >>> EpochProgress(4).epoch
        4
        >>> ddpkit.shutdown()
    """

    @classmethod
    def of(cls, epoch: int, resumed: EpochProgress | None) -> EpochProgress:
        """The progress of ``epoch``: the one a resume restored when it is that epoch's."""
        if resumed is not None and resumed.epoch == epoch:
            return resumed
        # the metric names the ranks agreed on last epoch: not agreed on again unless changed
        agreed = resumed.sums.agreed if resumed is not None else None
        return cls(epoch, agreed)

    def __init__(self, epoch: int, agreed: list[str] | None = None) -> None:
        self.epoch = epoch  # counted from 0, as the sampler's set_epoch does
        self.batches = 0
        self.sums = MetricSums(current_world().device, agreed)
        # the batch's losses given to backward, detached: the loop appends them itself
        self.losses: list[torch.Tensor] = []
        self._recorded: tuple[dict[str, Any], Any] | None = None  # the batch's own metrics
        self.generator_state: torch.Tensor | None = None  # the loader's, as the epoch began
        self.total: int | None = None  # the epoch's batches (None: unknown, a stream's)
        self.rng: dict[str, Any] | None = None  # restored just before the first new batch
        self._elapsed_before = 0.0
        self.resumed_at: int | None = None  # the global position a resume starts the epoch at
        self._base = (0, 0)  # (global position, batches) this process's batches count from
        self._per_batch: int | None = None  # global positions one batch on every rank covers
        self._started = time.perf_counter()
        self._ended: float | None = None  # when the epoch's last batch was done

    @property
    def elapsed_s(self) -> float:
        """Seconds spent on this epoch's batches, before an interruption included."""
        return self._elapsed_before + (self._ended or time.perf_counter()) - self._started

    def totals(self, rows: torch.Tensor | None = None) -> dict[str, float]:
        """The epoch's metrics over every rank (a collective) and its training time;
        ``rows``: every rank's ``sums.local_row()``, gathered already."""
        return {**self.sums.reduce(rows), "time_s": self.elapsed_s}

    def end(self) -> None:
        """The epoch's batches are done: its clock stops (evaluation is not training time)."""
        self._ended = time.perf_counter()

    def note_loss(self, loss: torch.Tensor) -> None:
        """A loss the batch gave to backward (several: their sum), its metric by default."""
        self.losses.append(loss.detach())

    def record(self, metrics: dict[str, Any], samples: Any) -> None:
        """The batch's own metrics, each a mean over ``samples`` (None: the batch's size)."""
        self._recorded = (metrics, samples)

    def end_batch(
        self, samples: int | None, skips_nonfinite: bool, done: int | None
    ) -> dict[str, Any]:
        """Add the batch's metrics (recorded, else its loss, a mean over ``samples``) to the
        sums; returns them. ``done``: the batches done once it ended a step (None: it did not).

        ``skips_nonfinite``: a batch whose loss is NaN/inf is left out of the sums (its step
        was skipped, ``nonfinite_loss="skip"``). Under ``"error"`` such a loss ends the run
        at its step, before any sum is reported: no check, no ops per batch."""
        losses = self.losses
        summed = losses[0] if len(losses) == 1 else _sum_of(losses)  # one (most): no call
        loss = {} if summed is None else {"loss": summed}
        metrics, recorded = self._recorded or (loss, None)
        count = recorded if recorded is not None else samples
        if count is None:
            raise ConfigError(
                "cannot tell how many samples this batch holds (no tensor in it has a first "
                "dimension): say it with loop.record(metrics, samples=N), or return a dict "
                "with 'samples' from the step"
            )
        if summed is not None and skips_nonfinite:
            self.sums.add(*only_if_finite(summed, metrics, count))
        else:
            self.sums.add(metrics, count)
        losses.clear()
        self._recorded = None
        if done is not None:
            self.batches = done
        return metrics

    def part_way(self) -> PartWay:
        """Where a checkpoint taken now stands in the epoch (a collective: the metric sums
        are summed over ranks).

        Example::

            checkpointer.save_here(loop, progress.part_way(), None)
        """
        return PartWay(self.state_dict(), self.generator_state)

    def where(self, epochs: int) -> str:
        """``epoch 1/3  batch 2/5`` (a loader without a length: ``batch 2``)."""
        total = self.total
        done = f"{self.batches}/{total}" if total is not None else str(self.batches)
        return f"epoch {self.epoch + 1}/{epochs}  batch {done}"

    def start(self) -> EpochStart:
        """Where this epoch starts, for :func:`~ddpkit.data.epochs.open_epoch`.

        Example::

            opened = open_epoch(loader, progress.start()); progress.opened(opened)
        """
        return EpochStart(self.epoch, self.batches, self.resumed_at, self.generator_state)

    def opened(self, opened: OpenedEpoch) -> None:
        """The epoch was opened: count from where it stands; the rank's random generators
        restored before its first new batch."""
        if opened.restarted:
            self._restart()  # saved with a prepare_loader loader, resumed with another kind
        self.batches, self.total, self._per_batch = opened.done, opened.total, opened.per_batch
        self._base, self.generator_state = opened.base, opened.facts.generator_state
        if self.rng is not None:
            restore_rng(self.rng)
            self.rng = None

    def position(self) -> int | None:
        """How many of the epoch's samples, over all ranks, are done (None: unknown, the
        loader is not ``prepare_loader``'s over a map-style dataset)."""
        if self._per_batch is None:
            return None
        done, counted = self._base
        return done + (self.batches - counted) * self._per_batch

    def state_dict(self) -> dict[str, Any]:
        """The position, with the metric sums summed over ranks (a collective).

        Example:
            >>> import ddpkit
            >>> _ = ddpkit.init()
            ddpkit: world size 1 ...
            >>> sorted(EpochProgress(0).state_dict())
            ['batches', 'elapsed_s', 'epoch', 'metric_names', 'metric_sums', 'samples']
            >>> ddpkit.shutdown()
        """
        names, sums = self.sums.reduced_sums()
        return {
            "epoch": self.epoch,
            "batches": self.batches,
            "samples": self.position(),
            "metric_names": names,
            "metric_sums": torch.tensor(sums, dtype=torch.float64),
            "elapsed_s": self.elapsed_s,
        }

    def load_state_dict(self, state: dict[str, Any], same_world: bool = True) -> None:
        """Continue the saved position; the summed metrics go to rank 0 alone, so the
        epoch's totals count them once. From another world size (``same_world=False``) the
        epoch goes on after the samples done over all ranks, where the checkpoint knows
        them (``prepare_loader``'s loaders over map-style data); otherwise it restarts.

        Example::

            progress.load_state_dict(checkpoint["progress"])
        """
        self.epoch = int(state["epoch"])
        self.resumed_at = state.get("samples")
        if not same_world and self.resumed_at is None:
            return  # the epoch restarts: nothing of it is kept
        self.batches = int(state["batches"]) if same_world else 0
        if is_main():
            self.sums.load(list(state["metric_names"]), state["metric_sums"])
        self._elapsed_before = float(state["elapsed_s"])

    def local_state(self) -> dict[str, Any]:
        """The position with this rank's own metric sums: no collective (a memory snapshot's,
        taken every step; :meth:`load_local_state` puts it back on the same rank).

        Example:
            >>> import ddpkit
            >>> _ = ddpkit.init()
            ddpkit: world size 1 ...
            >>> progress = EpochProgress(2)
            >>> again = EpochProgress(0)
            >>> again.load_local_state(progress.local_state())
            >>> again.epoch
            2
            >>> ddpkit.shutdown()
        """
        return {
            "epoch": self.epoch,
            "batches": self.batches,
            "samples": self.position(),
            "sums": self.sums.local_state(),
            "elapsed_s": self.elapsed_s,
        }

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Go on from :meth:`local_state` output of this rank."""
        self.epoch, self.batches = int(state["epoch"]), int(state["batches"])
        self.resumed_at = state["samples"]
        self.sums.load_local_state(state["sums"])
        self._elapsed_before = float(state["elapsed_s"])

    def _restart(self) -> None:
        """Forget the part of the epoch done (a loader that cannot go on at a position)."""
        self.batches, self.resumed_at, self._elapsed_before = 0, None, 0.0
        self.sums = MetricSums(current_world().device, self.sums.agreed)


def only_if_finite(
    loss: torch.Tensor, metrics: dict[str, Any], samples: Any
) -> tuple[dict[str, Any], Any]:
    """``metrics`` and ``samples``, or zeros when ``loss`` is NaN/inf: a batch whose step was
    skipped (``nonfinite_loss="skip"``) is left out of the epoch's means and sample count
    (its NaN would make the epoch's loss NaN). On the device: nothing waits for the GPU.

    Example:
        >>> only_if_finite(torch.tensor(float("nan")), {"loss": torch.tensor(float("nan"))}, 4)
        ({'loss': tensor(0.)}, tensor(0.))
    """
    finite = torch.isfinite(loss)
    kept = {name: torch.where(finite, value, 0.0) for name, value in metrics.items()}
    return kept, torch.where(finite, float(samples), 0.0)


def say_already_trained(done: int, epochs: int) -> None:
    """A run asked for ``epochs`` that its checkpoint already completed (``done``).

    Example:
        >>> say_already_trained(5, 3)  # doctest: +ELLIPSIS
        ddpkit: already trained 5 of 3 epochs; nothing to do ...
    """
    logger.info(
        f"already trained {done} of {epochs} epochs; nothing to do (ask for more epochs to "
        "continue, or move the checkpoints away to train from scratch)"
    )


def _sum_of(losses: list[torch.Tensor]) -> torch.Tensor | None:
    """An accumulation group's batch losses added up as backward saw them (None: none)."""
    return functools.reduce(operator.add, losses) if losses else None
