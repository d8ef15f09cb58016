"""A worker's side of failure reporting: its error file, and torch's mismatch error in brief.

torch's elastic agent gives each worker an error file (``TORCHELASTIC_ERROR_FILE``) and reads
it back when the worker fails. Function workers write it through torch's ``record``; script
workers write it through the excepthook :func:`install_error_file_hook` installs in
``ddpkit.init()``; the watchdog, the training loop and the preemption stop write theirs with
:func:`record_failure`. The launcher reads them (:mod:`ddpkit.launch.failures`); the layout
and the record kinds are :mod:`ddpkit._core.protocol`'s.

Example:
    >>> record_failure("rank 1 did not reach all_reduce", "...", RecordKind.HANG)  # no-op here
"""

from __future__ import annotations

import os
import sys
import traceback
from types import TracebackType

from ddpkit._core.log import EVERY_RANK, logger
from ddpkit._core.protocol import ERROR_FILE_ENV, RecordKind, error_record, write_error_file
from ddpkit._core.torcherrors import summarize_mismatch
from ddpkit.flightrecorder.records import recent_collectives


def install_error_file_hook() -> None:
    """Record an uncaught exception in torch elastic's error file before the worker exits.

    A no-op outside an elastic launch (no ``TORCHELASTIC_ERROR_FILE``). The previous
    excepthook still runs, so the traceback is printed as usual.

    Example:
        >>> install_error_file_hook()
    """
    if ERROR_FILE_ENV not in os.environ or getattr(sys.excepthook, "_ddpkit", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            stack = "".join(traceback.format_exception(kind, exc, tb))
            mismatch = summarize_mismatch(str(exc))
            if mismatch:  # torch's own text is one 1,000-character line; lead with the gist
                logger.error(mismatch, extra=EVERY_RANK)
                stack = f"{mismatch}\n{stack}"
            # A hang report or stop written first is the cause; this exception its echo
            # (the collective failed when a peer left after the report).
            record_failure(mismatch or f"{kind.__name__}: {exc}", stack, keep_failure=True)
        previous(kind, exc, tb)

    hook._ddpkit = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def record_failure(
    message: str, details: str, kind: RecordKind = RecordKind.ERROR, keep_failure: bool = False
) -> None:
    """Write this worker's failure (or stop, or state) where torch's elastic agent and ddpkit
    run read it.

    A no-op outside an elastic launch. ``message`` is the headline; ``details`` is the text
    (a traceback, a hang report) the launcher prints for the rank it blames; ``kind`` what
    the record is. A state record (training) never replaces a failure already written, nor
    does any record with ``keep_failure``.

    Example:
        >>> record_failure("stopped by SIGTERM", "...", RecordKind.PREEMPTED)  # no-op here
    """
    calls = None if kind.is_state else recent_collectives()  # the collectives it was in
    record = error_record(message, details, kind=kind, collectives=calls)
    write_error_file(record, keep_existing=kind.is_state or keep_failure)
