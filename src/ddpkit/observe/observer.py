"""The one part of a run that watches it: the loop tells it what happened, it never answers.

It holds the step clock (where each step's time goes), the ranks' report (every rank's times
and memory, shared at each epoch's end and inside it every ``log_every`` steps, or else about
every 10 s: after 50 steps first, then as many as rank 0 took 10 s for) and rank 0's
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
import time
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

TIMES_WINDOW = 50  # optimizer steps before the first sharing of the step times
# Then about this long between sharings (without log_every): each one is a collective and
# rank 0's look at every rank's row, 2-4 ms on gloo; every 50 steps it was 0.5% of a 15 ms
# step (benchmarks/loop_parity.py's GPT-2, 2026-12-07).
SHARE_EVERY_S = 10.0
_MOST_STEPS = 100_000


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
        self.log_every = log_every
        self.window = log_every or TIMES_WINDOW  # steps between sharing the times
        self._since, self._shared_at = 0, time.monotonic()  # steps since the last sharing

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
        """A batch ended no step (an accumulation group's earlier one); a step's batch is
        counted by :meth:`step_done`: one call a batch, not two."""
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
        if collective:  # written out, not a call: every step passes here
            self._since += 1
            every = self.log_every  # the step lines' own steps, else the agreed window
            if (step % every == 0) if every is not None else self._since >= self.window:
                self._share(loader, step)
        # Each only where it has something to do a step (a call each, about 3 us in a GPT-2
        # step's cold caches: benchmarks/loop_parts.py)
        profiler, console = self.profiler, self.console
        if profiler.spec is not None or profiler.window is not None:  # one ahead, or open
            profiler.step_done(step, self.ranks.latest, collective)
        if console.bar is not None or console.log_every:  # a bar to move, lines to show
            console.step_done(where, metrics)

    def _share(self, loader: LoaderFacts | None, step: int) -> None:
        """Every rank's times, and the next window: rank 0's proposal, carried in the same
        all-gather, so that every rank shares again at the same step."""
        proposal = torch.tensor([self._next_window()], dtype=torch.float64)
        times, carried = self.ranks.share_carrying(loader, proposal, self.profiler.asked())
        self.console.times = times
        if carried is not None and self.log_every is None:
            self.window = int(carried[0, 0].item())
        self._since, self._shared_at = 0, time.monotonic()
        if self.ranks.asked:
            self.profiler.requested(step)

    def _next_window(self) -> float:
        """The steps this rank took about :data:`SHARE_EVERY_S` for, at its pace since the
        last sharing (only rank 0's counts)."""
        per_step = (time.monotonic() - self._shared_at) / max(1, self._since)
        return float(min(_MOST_STEPS, max(1, round(SHARE_EVERY_S / max(per_step, 1e-9)))))

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
