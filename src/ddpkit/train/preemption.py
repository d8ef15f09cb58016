"""Preemption: on SIGTERM or SIGUSR1, checkpoint at the next step and exit with code 75.

Clusters warn before they take a node away: SLURM sends SIGTERM when a job is cancelled or
preempted (and SIGUSR1 before its time limit with ``--signal=USR1@SECONDS``), Kubernetes
sends SIGTERM to a pod it evicts, and torch's launcher passes the signals it gets on to its
workers. While ``Trainer.fit`` runs, these signals only raise a flag in the rank that got
them. At the next optimizer step every rank learns of it through the step guard's all-reduce
(:mod:`ddpkit.train.guards`), so all ranks stop at the same position: the checkpoint is written,
the ranks leave together, and each exits with :data:`PREEMPTED_EXIT_CODE`. ``ddpkit run``
exits with it too, and running the same command again resumes from that checkpoint.

Outside ``fit`` the process ends at once: with exit code 75 in a worker ``ddpkit run`` started
(:func:`ddpkit.launch.worker.stop_outside_training`), as by default otherwise. Ctrl-C
(SIGINT) is not a preemption: it stops the job straight away.

Example:
    >>> with StopSignals() as signals:
    ...     signals.received is None
    True
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

from ddpkit._core.log import logger
from ddpkit._core.protocol import PREEMPTED_EXIT_CODE, PREEMPTED_MARKER, STOP_SIGNALS
from ddpkit._core.system import flush_and_exit
from ddpkit.runtime.collectives import barrier
from ddpkit.runtime.errorfile import record_failure


class StopSignals:
    """While entered, SIGTERM and SIGUSR1 set :attr:`signum` instead of ending the process.

    Python runs signal handlers in the main thread only, so in any other thread this does
    nothing and the signals keep their default action. The handler only records the signal:
    the training loop decides, at a step boundary, what to do about it.

    Example:
        >>> import os
        >>> with StopSignals() as signals:
        ...     os.kill(os.getpid(), signal.SIGUSR1)
        ...     signals.received
        'SIGUSR1'
    """

    def __init__(self) -> None:
        self.signum = 0  # the first stop signal received; 0: none
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
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


def exit_preempted(signal_name: str, where: str, path: object) -> None:
    """Every rank: say what was saved, leave together, exit with :data:`PREEMPTED_EXIT_CODE`.

    Called by every rank at the same step once the checkpoint is written (under DDP rank 0
    writes it; the barrier keeps the others from leaving, and the launcher from stopping
    rank 0, before it is on disk).

    Example::

        exit_preempted("SIGTERM", "epoch 5, step 412", "runs/x/...")
    """
    message = (
        f"stopped by {signal_name} at {where} after saving {path}; run the same command "
        "again to resume"
    )
    logger.info(f"{message} (exit code {PREEMPTED_EXIT_CODE})")
    record_failure(PREEMPTED_MARKER + message, PREEMPTED_MARKER + message)
    barrier()
    # Not sys.exit: the user's code after fit() (more training, evaluation) must not run on
    # a job that was told to stop, and every rank leaves at the same point.
    flush_and_exit(PREEMPTED_EXIT_CODE)
