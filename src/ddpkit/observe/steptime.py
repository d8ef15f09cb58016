"""Where a rank's step time goes: waiting for data, computing, exposed sync, the optimizer, other.

The loop tells the clock each time a step moves on (a batch is requested, it arrived, the
backward returned, the optimizer step began, the step ended); the clock adds the time since
the last move to the phase that was running. The phases:

- **data**: waiting for the next batch and moving it to the device (host clock: the host
  is what waits);
- **compute**: forward and backward, up to the moment the last parameter's gradient is
  ready, and your code until the optimizer step;
- **sync**: from that moment to the backward's return: the gradient all-reduce that the
  backward did not hide (*exposed* communication; this is where a rank waits for a slower
  one). The last gradient is found once, on the first backward (a hook on each parameter,
  then on that one only). FSDP's sharded parameters give no such moment: their
  reduce-scatter is counted in compute;
- **optimizer**: the guard's verdict, ``opt.step()``, your scheduler step;
- **other**: the rest of the wall time: checkpoints, evaluation, callbacks, the epoch's end.

On a GPU, compute, sync and the optimizer are timed by CUDA events on the current stream
(the host runs ahead of the GPU, so its clock would time the launches), read only when the
ranks share their times; data and wall time stay on the host clock.

Example:
    >>> import torch
    >>> model = torch.nn.Linear(2, 1)
    >>> clock = StepClock([model], torch.device("cpu"))
    >>> clock.enter(Phase.COMPUTE)
    >>> model(torch.ones(3, 2)).sum().backward()
    >>> clock.backward_done()
    >>> clock.enter(Phase.OPTIMIZER)
    >>> clock.step_done()
    >>> times = clock.totals()
    >>> times.steps, times.seconds[Phase.COMPUTE] > 0
    (1, True)
"""

from __future__ import annotations

import enum
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


class Phase(enum.Enum):
    """The parts of a step (see the module's docstring).

    Example:
        >>> [phase.value for phase in Phase]
        ['data', 'compute', 'sync', 'optimizer', 'other']
    """

    DATA = "data"
    COMPUTE = "compute"
    SYNC = "sync"
    OPTIMIZER = "optimizer"
    OTHER = "other"

    # Members are singletons, so identity is a hash; Enum's own __hash__ is Python code,
    # which the clock's dicts ran a dozen times a step.
    __hash__ = object.__hash__


DEVICE_PHASES = (Phase.COMPUTE, Phase.SYNC, Phase.OPTIMIZER)  # CUDA events time these on GPU
WORK = (Phase.DATA, Phase.COMPUTE, Phase.OPTIMIZER)  # what a rank does itself, not waiting
_STEPS_KEPT = 1024  # recent steps whose own work is kept for the percentile
_MAX_PENDING = 4096  # GPU intervals kept unread at most (reading them waits for the GPU)


@dataclass(frozen=True)
class StepTimes:
    """A rank's steps and seconds by phase since the epoch began (other: the rest of wall).

    Example:
        >>> StepTimes(2, 1.0, {Phase.DATA: 0.5}).seconds[Phase.OTHER]
        0.5
    """

    steps: int
    wall_s: float
    timed: dict[Phase, float]
    quick_work_s: float = 0.0  # data + compute + optimizer of its quicker steps (25th pct.)

    @property
    def seconds(self) -> dict[Phase, float]:
        """Every phase's seconds, other included."""
        known: dict[Phase, float] = {
            phase: self.timed.get(phase, 0.0) for phase in Phase if phase is not Phase.OTHER
        }
        return {**known, Phase.OTHER: max(0.0, self.wall_s - sum(known.values()))}


class StepClock:
    """One rank's step times, phase by phase (``enabled=False``: it does nothing).

    Example::

        clock = StepClock(run.models.values(), world.device)
    """

    def __init__(self, models: Iterable[nn.Module], device: torch.device) -> None:
        self.enabled = True
        # a profiled window's listener: told each phase's interval (perf_counter seconds)
        self.tap: Callable[[Phase, float, float], None] | None = None
        self._cuda = device.type == "cuda"
        self._grads = GradsReady([p for m in models for p in m.parameters()], self._cuda)
        self._armed = False
        self.restart()

    def restart(self) -> None:
        """Start counting afresh (an epoch begins), in the 'other' phase."""
        self.steps = 0
        self._phase = Phase.OTHER
        self._started = self._since = time.perf_counter()
        self._event = self._record()
        self._host: dict[Phase, float] = dict.fromkeys(Phase, 0.0)
        self._device: dict[Phase, float] = dict.fromkeys(DEVICE_PHASES, 0.0)  # GPU: read
        self._pending: list[tuple[Phase, int, Any, Any]] = []  # GPU: unread intervals
        self._work: deque[float] = deque(maxlen=_STEPS_KEPT)  # each recent step's own work
        self._step_work = 0.0  # ... and the step in progress's, so far

    def enter(self, phase: Phase) -> None:
        """The step moves on to ``phase``; the time since the last move goes to the last."""
        if not self.enabled:
            return
        now = time.perf_counter()
        # The host's clock alone (no profiler tap, no CUDA), written out: _record and _add
        # are 8 calls a step, about 8 us with a real model's cold caches (~1 us a call,
        # benchmarks/loop_parity.py), 0.1% of the parity MLP's 7.4 ms step in 1 worker (docs/
        # benchmarks.md, 2026-11-29), where the loop's whole cost read 1.5-2%; the call count
        # is held by tests/unit/train/test_step_path.py
        if self.tap is None and not self._cuda:
            seconds, last = now - self._since, self._phase
            self._host[last] += seconds
            if last in WORK:
                self._step_work += seconds
            self._phase, self._since = phase, now
        else:
            event = self._record()
            self._add(self._phase, self._since, now, self._event, event)
            self._phase, self._since, self._event = phase, now, event
        if phase is Phase.COMPUTE and not self._armed:
            self._grads.arm()  # once: the hooks stay until calibrated, then one stays
            self._armed = True

    def backward_done(self) -> None:
        """A backward returned: the time since the last gradient was ready is exposed sync."""
        if not self.enabled:
            return
        grads = self._grads  # calibrated (most backwards): its last hook's time, no call
        ready_at, ready_event = (
            (grads.at, grads.event) if grads.calibrated else grads.settle(since=self._since)
        )
        if ready_at is None or ready_at < self._since:
            return  # no gradient hook ran: all of it stays compute
        now = time.perf_counter()
        if self.tap is None and not self._cuda:  # the host's clock alone, written out as in
            since, host = self._since, self._host  # enter(): the first calls after a backward
            host[Phase.COMPUTE] += ready_at - since  # are its coldest (two _add calls: 7 us
            host[Phase.SYNC] += now - ready_at  # of a GPT-2 step's, benchmarks/loop_parts)
            self._step_work += ready_at - since  # compute is the rank's own work, sync is not
            self._since = now
            return
        event = self._record() if self._cuda else None
        self._add(Phase.COMPUTE, self._since, ready_at, self._event, ready_event)
        self._add(Phase.SYNC, ready_at, now, ready_event, event)
        self._since, self._event = now, event

    def step_done(self) -> None:
        """An optimizer step ended; what follows until the next batch request is 'other'."""
        if self.enabled:
            self.enter(Phase.OTHER)
            self.steps += 1
            self._work.append(self._step_work)
            self._step_work = 0.0

    def totals(self) -> StepTimes:
        """The epoch's times so far (on a GPU this waits for the events recorded so far)."""
        now = time.perf_counter()
        timed = dict(self._host)
        timed[self._phase] += now - self._since  # the phase in progress, up to now
        if self._cuda:
            self._read_events()
            timed.update(self._device)
        done = list(self._work)
        # "inclusive": between the quickest steps; the default extrapolates past the quickest
        # (few, uneven steps: a negative work time, and a straggler "inf% slower").
        quick = (
            statistics.quantiles(done, n=4, method="inclusive")[0] if len(done) > 1 else sum(done)
        )
        return StepTimes(self.steps, now - self._started, timed, quick)

    def close(self) -> None:
        """Remove the gradient hook (training is over)."""
        self._grads.remove()

    def _add(self, phase: Phase, start: float, end: float, start_ev: Any, end_ev: Any) -> None:
        self._host[phase] += end - start
        if self.tap is not None:
            self.tap(phase, start, end)
        if self._cuda and phase in DEVICE_PHASES and start_ev is not None:
            self._pending.append((phase, self.steps, start_ev, end_ev))
            if len(self._pending) > _MAX_PENDING:  # an epoch without a shared window
                self._read_events()
        elif phase in WORK:  # host-timed: the step in progress's
            self._step_work += end - start

    def _add_work(self, phase: Phase, step: int, seconds: float) -> None:
        if phase not in WORK:
            return
        if step == self.steps:  # the step in progress
            self._step_work += seconds
            return
        kept = step - (self.steps - len(self._work))  # a done step's place, if still kept
        if kept >= 0:
            self._work[kept] += seconds

    def _read_events(self) -> None:
        """Add the recorded GPU intervals to the device times (waits for the last one)."""
        for phase, step, start, end in self._pending:
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000.0
            self._device[phase] += seconds
            self._add_work(phase, step, seconds)
        self._pending.clear()

    def _record(self) -> Any:
        if not self._cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record()
        return event


class GradsReady:
    """When the last parameter's gradient of a backward was ready: hooks on every parameter
    for the first backward, then on the one that came last only (the order does not change).

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> grads = GradsReady(list(model.parameters()), cuda=False)
        >>> grads.arm()
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> grads.settle(since=0.0)[0] is not None
        True
    """

    def __init__(self, params: list[nn.Parameter], cuda: bool) -> None:
        self._params = [p for p in params if p.requires_grad]
        self._cuda = cuda
        self._handles: dict[int, Any] = {}
        self.calibrated = False  # only the last parameter's hook is left
        self._last: int | None = None
        self.at: float | None = None  # when the last hook ran (time.perf_counter())
        self.event: Any = None  # ... and its CUDA event

    def arm(self) -> None:
        """Before the first backward: a hook on every parameter."""
        if self.calibrated or self._handles:
            return
        for index, param in enumerate(self._params):
            hook = self._hook(index)
            self._handles[index] = param.register_post_accumulate_grad_hook(hook)  # type: ignore[no-untyped-call]

    def settle(self, since: float) -> tuple[float | None, Any]:
        """After a backward: when its last gradient was ready (None: no hook ran since
        ``since``), and its CUDA event. The first time, only that parameter's hook stays."""
        if not self.calibrated and self._handles and self._last is not None:
            for index, handle in list(self._handles.items()):
                if index != self._last:
                    handle.remove()
                    del self._handles[index]
            self.calibrated = True
        if self.at is None or self.at < since:
            return None, None
        return self.at, self.event

    def remove(self) -> None:
        """Remove every hook."""
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()

    def _hook(self, index: int) -> Any:
        def ready(_param: torch.Tensor) -> None:
            self.at, self._last = time.perf_counter(), index
            if self._cuda:  # marks the GPU stream right after this gradient's kernels
                self.event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                self.event.record()

        return ready
