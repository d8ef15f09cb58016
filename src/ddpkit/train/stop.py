"""Stopping a run early: stop signals, the reasons a run stops, and the one exit point.

SLURM sends SIGTERM when it cancels or preempts a job (and SIGUSR1 before its time limit
with ``--signal=USR1@SECONDS``), Kubernetes when it evicts a pod, and torch's launcher passes
them on. While the loop trains they only raise a flag (:class:`StopSignals`); the step
guard's all-reduce (:mod:`ddpkit.train.guard`) stops every rank at the same step.

A stop is data, not an exit inside a method: the loop gets a :class:`Stop` (preempted after
its checkpoint, or ``DDPKIT_MAX_STEPS`` spent, as ``ddpkit verify`` and ``doctor --run`` ask),
runs the end hooks (logs flushed and closed, the tools' records written), then calls
:func:`leave`, the one place in ``train/`` where the process ends: every rank together, with
the stop kind's value (75 for a preemption: running the same command again resumes). Outside
training a stop signal ends a worker at once with 75 (:mod:`ddpkit.launch.worker`); Ctrl-C
is no preemption.

Example:
    >>> Stop(StopKind.STEP_LIMIT, "stopped after 20 optimizer steps").kind.value
    0
    >>> with StopSignals() as signals:
    ...     signals.received is None
    True
"""

from __future__ import annotations

import enum
import signal
import threading
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any, NoReturn

from ddpkit._core.log import logger
from ddpkit._core.protocol import PREEMPTED_EXIT_CODE, STOP_SIGNALS, RecordKind
from ddpkit._core.system import flush_and_exit
from ddpkit.runtime.collectives import barrier
from ddpkit.runtime.errorfile import record_failure


class StopKind(enum.Enum):
    """Why a run stops before its last epoch; the value is the exit code.

    Example:
        >>> StopKind.PREEMPTED.value
        75
    """

    PREEMPTED = PREEMPTED_EXIT_CODE  # a stop signal, after saving a checkpoint
    STEP_LIMIT = 0  # DDPKIT_MAX_STEPS optimizer steps are done


@dataclass(frozen=True)
class Stop:
    """A run's early stop: its kind and the line that says what happened.

    Example:
        >>> Stop(StopKind.PREEMPTED, "stopped by SIGTERM at epoch 2, step 9").kind.value
        75
    """

    kind: StopKind  # its value is the exit code
    message: str


class StopSignals:
    """While entered, SIGTERM and SIGUSR1 set :attr:`signum` instead of ending the process;
    the loop decides at a step boundary what to do about it. (Python runs signal handlers in
    the main thread only: in another thread the signals keep their default action.)

    Example:
        >>> import os
        >>> with StopSignals() as signals:
        ...     os.kill(os.getpid(), signal.SIGUSR1)
        ...     signals.received
        'SIGUSR1'
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled  # False: the signals keep their handlers (nothing to save to)
        self.signum = 0  # the first stop signal received; 0: none
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> StopSignals:
        if self.enabled and threading.current_thread() is threading.main_thread():
            for name in STOP_SIGNALS:
                number = getattr(signal, name, None)  # SIGUSR1 does not exist on Windows
                if number is not None:
                    self._previous[number] = signal.signal(number, self._note)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous.clear()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        # No printing here: the main thread may be inside a print of its own (reentrancy).
        if not self.signum:
            self.signum = signum

    @property
    def received(self) -> str | None:
        """The name of the stop signal received, or None."""
        return signal.Signals(self.signum).name if self.signum else None


def leave(stop: Stop) -> NoReturn:
    """Every rank: say why the run stopped, leave together, exit with the stop's code.

    Called by every rank at the same step, after the end hooks ran (under DDP rank 0 writes
    the checkpoint; the barrier keeps the others from leaving, and the launcher from stopping
    rank 0, before it is on disk).

    Example::

        leave(Stop(StopKind.PREEMPTED, "stopped by SIGTERM at epoch 5, step 412 ..."))
    """
    if stop.kind is StopKind.PREEMPTED:
        logger.info(f"{stop.message} (exit code {stop.kind.value})")
        record_failure(stop.message, stop.message, RecordKind.PREEMPTED)
    else:
        logger.info(stop.message)
    barrier()
    # Not sys.exit: the user's code after the loop (more training, evaluation) must not run
    # on a job that was told to stop, and every rank leaves at the same point.
    flush_and_exit(stop.kind.value)


def preempted(signal: str, path: str, where: str) -> Stop:
    """The stop a signal makes once every rank saved ``path`` at ``where``: exit 75.

    Example:
        >>> preempted("SIGTERM", "runs/x/epoch_000002.pt", "epoch 2").kind.name
        'PREEMPTED'
    """
    said = f"stopped by {signal} at {where} after saving {path}; run the same command again"
    return Stop(StopKind.PREEMPTED, said + " to resume")
