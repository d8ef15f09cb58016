"""The one part of a run that watches it: the loop tells it what happened, it never answers.

It holds the step clock (where each step's time goes), the ranks' report (every rank's times
and memory, shared every ``log_every`` or 50 steps and at each epoch's end) and rank 0's
console (the start-up line, the bar, step and epoch lines). The experiment logs and the
bench report listen through the run's callbacks instead: they are hooks users may add to.

Example:
    >>> import torch, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> observer = RunObserver([torch.nn.Linear(2, 1)], torch.device("cpu"), log_every=None)
    >>> observer.window
    50
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ddpkit.data.epochs import LoaderFacts
from ddpkit.observe.console import Console, SetupLine
from ddpkit.observe.profiling.profiler import RankProfiler, profile_folder
from ddpkit.observe.profiling.spec import ProfileSpec
from ddpkit.observe.rankreport import RankReport
from ddpkit.observe.steptime import StepClock

TIMES_WINDOW = 50  # optimizer steps between sharing the step times (without log_every)


class RunObserver:
    """The clock, the ranks' report and the console of one run, told each moment in turn.

    Example::

        observer.step_done(step=100, collective=True, loader=train, where=..., metrics={})
    """

    def __init__(
        self, models: Iterable[nn.Module], device: torch.device, log_every: int | None,
        profile: ProfileSpec | None = None, profile_dir: Path | None = None,
    ) -> None:  # fmt: skip
        self.clock = StepClock(models, device)
        self.ranks = RankReport(self.clock)
        spec = ProfileSpec.from_environment(os.environ) or profile  # ddpkit run's flag wins
        self.profiler = RankProfiler(spec, self.clock, profile_dir or profile_folder(None))
        self.console = Console(log_every)
        self.window = log_every or TIMES_WINDOW  # steps between sharing the times

    def fit_started(
        self, setup: SetupLine, resumed: Mapping[str, Any] | None, step: int = 0
    ) -> None:
        """The run starts at optimizer step ``step``: its set-up line (and what a resume did
        to the batch); a profiled window from the first step opens now."""
        self.console.fit_started(setup, resumed)
        self.profiler.step_done(step, None, collective=True)

    def epoch_started(self, epoch: int, epochs: int, total: int | None, done: int) -> None:
        """Epoch ``epoch`` (from 0) starts with ``done`` of ``total`` batches behind it."""
        self.console.epoch_started(epoch, epochs, total, done)
        self.ranks.epoch_started()

    def batch_done(self) -> None:
        self.console.batch_done()

    def step_done(
        self,
        step: int,
        collective: bool,
        loader: LoaderFacts | None,
        where: Callable[[], str],
        metrics: Mapping[str, Any],
    ) -> None:
        """Optimizer step ``step`` is done; every ``window`` steps the ranks share their times
        (only when ``collective``: every rank is at this step, not in an uneven epoch)."""
        if collective and step % self.window == 0:
            self.console.times = self.ranks.share(loader, asks=self.profiler.asked())
            if self.ranks.asked:
                self.profiler.requested(step)
        self.profiler.step_done(step, self.ranks.latest, collective)
        self.console.step_done(where, metrics)

    def epoch_times(
        self, loader: LoaderFacts | None, carry: torch.Tensor | None = None
    ) -> tuple[dict[str, float], torch.Tensor | None]:
        """The epoch's step times and memory, shared by every rank (a collective), and every
        rank's ``carry`` row gathered in the same collective (the epoch's metric sums)."""
        return self.ranks.epoch_end(loader, carry)

    def epoch_done(self, metrics: dict[str, float], epochs: int, trained: bool) -> None:
        """The epoch's line (with the ranks' times when it ``trained`` batches here)."""
        self.console.epoch_done(metrics, epochs, self.ranks.latest if trained else None)

    def close(self, finished: bool = True) -> None:
        """The run ends: ``finished`` its epochs, or stopped early."""
        self.profiler.close()
        self.clock.close()
