"""A worker's side of failure reporting: its error file, and torch's mismatch error in brief.

torch's elastic agent gives each worker an error file (``TORCHELASTIC_ERROR_FILE``) and reads
it back when the worker fails. Function workers write it through torch's ``record``; script
workers write it through the excepthook :func:`install_error_file_hook` installs in
``ddpkit.init()``; the watchdog and the preemption stop write theirs with
:func:`record_failure`. The launcher reads them (:mod:`ddpkit.launch.failures`); the layout
and the markers are :mod:`ddpkit._core.protocol`'s.

Example:
    >>> record_failure("hang: rank 1 did not reach all_reduce", "...")  # no launcher: no-op
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import traceback
from pathlib import Path
from types import TracebackType

from ddpkit._core.log import EVERY_RANK, logger
from ddpkit._core.protocol import ERROR_FILE_ENV, error_record


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
            record_failure(mismatch or f"{kind.__name__}: {exc}", stack)
        previous(kind, exc, tb)

    hook._ddpkit = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def record_failure(message: str, details: str) -> None:
    """Write this worker's failure where torch's elastic agent (and ddpkit run) read it.

    A no-op outside an elastic launch. ``message`` is the headline; ``details`` is the text
    (a traceback, a hang report) the launcher prints for the rank it blames.

    Example:
        >>> record_failure("preempted: stopped by SIGTERM", "...")  # no launcher: no-op
    """
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    with contextlib.suppress(OSError):  # reporting the failure must never hide it
        Path(path).write_text(json.dumps(error_record(message, details)))


_MISMATCH_CALL = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d+), "
    r"OpType=(\w+)(?:, TensorShape=\[([^\]]*)\], TensorDtypes=(\w+))?"
)


def summarize_mismatch(text: str) -> str | None:
    """torch's TORCH_DISTRIBUTED_DEBUG=DETAIL mismatch error in one line, or None.

    Example:
        >>> print(summarize_mismatch(
        ...     "Detected mismatch between collectives on ranks. Rank 0 is running collective: "
        ...     "CollectiveFingerPrint(SequenceNumber=4, OpType=ALLREDUCE, TensorShape=[3], "
        ...     "TensorDtypes=Float, ...), but Rank 1 is running collective: CollectiveFinger"
        ...     "Print(SequenceNumber=4, OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Float, "
        ...     "...).Collectives differ in the following aspects:   Tensor Tensor shapes: 3vs 4"))
        collective mismatch at call #4: rank 0 calls ALLREDUCE [3] Float,
        rank 1 calls ALLREDUCE [4] Float (shapes: 3vs 4)
    """
    if "Detected mismatch between collectives" not in text:
        return None
    found = _MISMATCH_CALL.findall(text)
    calls = [f"rank {r} calls {op}" + (f" [{shape}] {dtype}" if dtype else "")
             for r, _, op, shape, dtype in found]  # fmt: skip
    where = f" at call #{found[0][1]}" if found else ""
    _, _, aspects = text.partition("differ in the following aspects:")
    aspects = " ".join(aspects.replace("Tensor", "").split())
    return f"collective mismatch{where}: {', '.join(calls)}" + (f" ({aspects})" if aspects else "")
