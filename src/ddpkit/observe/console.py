"""What a run shows as it goes: the start-up line, tqdm's bar, a line every N steps, epoch lines.

The start-up line is the run's set-up (``ddpkit.observe.runsetup.RunSetup``: strategy, global
batch, learning rates, precision, the sampler's padding), said once. Rank 0's bar shows the
latest step's metrics on a terminal (under ``ddpkit run``: when its console is one);
elsewhere (CI logs, pipes) a line every ``log_every`` steps helps instead. Every line is a
record of the ``ddpkit`` logger from rank 0, so
``logging.getLogger("ddpkit").setLevel(logging.WARNING)`` silences them all.

Example:
    >>> format_epoch({"epoch": 1.0, "loss": 0.5, "samples": 8.0, "time_s": 1.25}, 10)
    'epoch 1/10  loss 0.5000  (1.25 s)'
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from tqdm import tqdm

from ddpkit._core.log import PLAIN, logger
from ddpkit._core.protocol import LIVE_CONSOLE_ENV
from ddpkit.observe.ranktimes import RankTimes
from ddpkit.runtime.collectives import is_main


class SetupLine(Protocol):
    """What the console asks of a run's set-up (``ddpkit.observe.runsetup.RunSetup``)."""

    def describe(self) -> str: ...

    def change_from(self, saved: Mapping[str, Any] | None) -> str | None: ...


class Console:
    """Rank 0's lines and bar for one run.

    Example:
        >>> Console(log_every=None).epoch_done({"epoch": 1.0, "loss": 0.25, "time_s": 0.5}, 2)
        epoch 1/2  loss 0.2500  (0.50 s)
    """

    def __init__(self, log_every: int | None) -> None:
        self.log_every = log_every
        self.bar: Any = None  # the epoch's progress bar (None: hidden)
        self._since = time.perf_counter()
        self._steps = 0  # since the last line
        self._in_epoch = 0  # steps taken in this epoch (by this run, when it resumed one)
        self._bar_shown = 0.0  # when the bar's metrics were last refreshed
        self._said_setup = False
        self.times: RankTimes | None = None  # the ranks' step times, as last shared

    def fit_started(self, setup: SetupLine, resumed: Mapping[str, Any] | None = None) -> None:
        """Say how the run is set up (once: a second ``fit`` of the same run says nothing),
        and what a resume at another world size did to the batch (``resumed``: the batch
        facts of the checkpoint resumed from)."""
        if not self._said_setup:
            logger.info(setup.describe())
            change = setup.change_from(resumed)
            if change:
                logger.info(change)
        self._said_setup = True

    def epoch_started(self, epoch: int, epochs: int, total: int | None, done: int) -> None:
        """Epoch ``epoch`` (from 0) of ``epochs`` starts, ``done`` of ``total`` batches done."""
        self._close_bar()
        if not _bar_hidden():  # a hidden bar is not built: tqdm's set-up, every epoch, for none
            self.bar = tqdm(
                desc=f"epoch {epoch + 1}/{epochs}", total=total, initial=done, leave=False
            )
        self._in_epoch = 0

    def batch_done(self) -> None:
        """One more batch of the epoch that ended no step (an accumulation group's earlier
        one); a step's batch is counted by :meth:`step_done`."""
        if self.bar is not None:
            self.bar.update(1)

    def step_done(self, where: Callable[[], str], metrics: Mapping[str, Any]) -> None:
        """After an optimizer step, its batch counted; ``where()`` says where (``epoch 1/3
        batch 2/5``) when a line is due, every ``log_every`` steps of the epoch, with rank
        0's step ``metrics``."""
        if self.bar is not None:
            self.bar.update(1)
            self._show_on_bar(metrics)
        self._steps += 1
        self._in_epoch += 1
        if not self.log_every or self._in_epoch % self.log_every or not is_main():
            return
        now = time.perf_counter()
        pace = (now - self._since) / self._steps
        self._since, self._steps = now, 0
        shown = "".join(f"  {name} {float(value):.4f}" for name, value in metrics.items())
        times = f"; {self.times.compact()}" if self.times is not None else ""
        logger.info(f"{where()}{shown}  ({pace:.3f} s/step{times})", extra=PLAIN)

    def epoch_done(
        self, metrics: dict[str, float], epochs: int, times: RankTimes | None = None
    ) -> None:
        """The epoch's line, with its metrics reduced over ranks and the ranks' step times."""
        self._close_bar()
        self.times = None  # the next epoch's come with its first shared window
        logger.info(format_epoch(metrics, epochs, times), extra=PLAIN)

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _show_on_bar(self, metrics: Mapping[str, Any]) -> None:
        if self.bar is None:
            return
        now = time.perf_counter()
        if now - self._bar_shown >= 0.5:
            self._bar_shown = now
            shown = {name: f"{float(value):.4f}" for name, value in metrics.items()}
            if self.times is not None:
                shown["time"] = self.times.per_step()
            self.bar.set_postfix(shown)


def _bar_hidden() -> bool:
    """Rank 0 draws the bar where someone watches: under ``ddpkit run``, when its console is
    a terminal (the worker's own stderr is a file there); elsewhere when stderr is one, as
    tqdm decides itself (not in CI logs or pipes)."""
    if not is_main():
        return True
    if os.environ.get(LIVE_CONSOLE_ENV) == "1":
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    return isatty is not None and not isatty()


def format_epoch(metrics: dict[str, float], epochs: int, times: RankTimes | None = None) -> str:
    """One log line for an epoch's metrics (the step-time and memory figures: ``times``).

    Example:
        >>> format_epoch({"epoch": 2.0, "loss": 0.5, "val_loss": 0.7, "time_s": 3.0}, 10)
        'epoch 2/10  loss 0.5000  val_loss 0.7000  (3.00 s)'
        >>> format_epoch({"epoch": 3.0, "val_loss": 0.6}, 10)
        'epoch 3/10  val_loss 0.6000  (no batch trained)'
    """
    parts = [f"epoch {int(metrics['epoch'])}/{epochs}"]
    shown = {k: v for k, v in metrics.items() if k not in ("epoch", "time_s")}
    parts += [f"{k} {v:.4f}" for k, v in shown.items() if not _unshown(k)]
    timing = f"; {times.compact()}" if times is not None else ""
    trained = "time_s" in metrics  # none when the epoch's body trained no batch here
    parts.append(f"({metrics['time_s']:.2f} s{timing})" if trained else "(no batch trained)")
    return "  ".join(parts)


def _unshown(name: str) -> bool:
    """Counts, and the figures the epoch line shows in its own form."""
    return name.endswith("samples") or name.startswith(("time/", "mem/"))
