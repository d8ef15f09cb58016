"""How a worker's failure reaches the launcher, and which worker is to blame.

torch's elastic agent gives each worker an error file (``TORCHELASTIC_ERROR_FILE``) and reads
it back when the worker fails. Function workers write it through torch's ``record``; script
workers write it through the excepthook :func:`install_error_file_hook` installs in
``ddpkit.init()``. The agent itself reports only some of the failed workers, and when one
worker dies its peers fail within the same second with "Connection closed by peer": so the
launcher reads every worker's error file and blames the one whose error is not such an echo.

Example:
    >>> is_echo("RuntimeError: Connection closed by peer [127.0.0.1]:4242")
    True
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ddpkit.errors import WorkerFailedError

# What a worker reports when a *peer* died: a consequence, not the cause.
_ECHOES = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote worker crashing",
    "communicator was aborted",
    "hang reported by rank",  # a rank that answered another rank's hang report
)
HANG_REPORT_PREFIX = "hang: "  # how the watchdog's report starts
_NO_DETAIL = "no error recorded; see the worker's output above"


@dataclass(frozen=True)
class Failure:
    """One failed worker: global rank, exit code, what it said, and when (epoch seconds).

    Example:
        >>> Failure(rank=1, exitcode=1, text="ValueError: x", timestamp=0).is_echo
        False
    """

    rank: int
    exitcode: int
    text: str
    timestamp: int

    @property
    def is_echo(self) -> bool:
        """True when this worker only failed because a peer died."""
        return is_echo(self.text)


def is_echo(text: str) -> bool:
    """True for errors that report a dead peer rather than a cause of their own.

    Example:
        >>> is_echo("ValueError: bad shape")
        False
    """
    lowered = text.lower()
    return any(echo in lowered for echo in _ECHOES)


def root_cause(err: ChildFailedError, log_dir: str | os.PathLike[str]) -> WorkerFailedError:
    """The worker to blame for ``err``, with its traceback, as a WorkerFailedError.

    Example:
        >>> root_cause(child_failed, "/tmp/logs").rank  # doctest: +SKIP
        1
    """
    failures = _all_failures(err, Path(log_dir))
    ranked = sorted(failures, key=_blame_order)
    cause = ranked[0]
    others = [f"rank {f.rank}" + (" after its peer died" if f.is_echo else "") for f in ranked[1:]]
    detail = cause.text + (f"\n(also failed: {', '.join(others)})" if others else "")
    return WorkerFailedError(rank=cause.rank, exitcode=cause.exitcode, detail=detail)


def _blame_order(f: Failure) -> tuple[bool, bool, bool, int, int]:
    # A hang report names the rank at fault itself; the agent's SIGTERM to the other workers
    # can carry the same timestamp.
    report = f.text.startswith(HANG_REPORT_PREFIX)
    return (not report, f.is_echo, f.text == _NO_DETAIL, f.timestamp, f.rank)


def _all_failures(err: ChildFailedError, log_dir: Path) -> list[Failure]:
    reported = {rank: _from_process_failure(rank, pf) for rank, pf in err.failures.items()}
    rank_offset = next((rank - pf.local_rank for rank, pf in err.failures.items()), 0)
    for local_rank, (text, timestamp) in _read_error_files(log_dir).items():
        rank = local_rank + rank_offset
        # A worker that recorded an exception failed with it (exit code 1), even when the
        # agent's SIGTERM reached it while it was still exiting.
        exitcode = reported[rank].exitcode if rank in reported else 1
        reported[rank] = Failure(rank, exitcode if exitcode > 0 else 1, text, timestamp)
    return list(reported.values())


def _from_process_failure(rank: int, failure: ProcessFailure) -> Failure:
    text = _message_text(failure.message)  # torch describes signal deaths itself
    return Failure(rank, failure.exitcode, text or _NO_DETAIL, int(failure.timestamp))


def _message_text(message: Any) -> str:
    if isinstance(message, dict):
        callstack = message.get("extraInfo", {}).get("py_callstack")
        return str(callstack or message.get("message", "")).rstrip()
    # Without an error file torch substitutes a link to its docs: no information.
    return "" if "pytorch.org" in str(message) else str(message)


def error_file_texts(log_dir: str | os.PathLike[str]) -> list[str]:
    """What each worker of the newest attempt recorded in its error file, by local rank.

    Example:
        >>> error_file_texts("/nonexistent")
        []
    """
    found = _read_error_files(Path(log_dir))
    return [found[rank][0] for rank in sorted(found)]


def _read_error_files(log_dir: Path) -> dict[int, tuple[str, int]]:
    """``{local_rank: (text, timestamp)}`` from the newest restart attempt's error files."""
    attempts = sorted(log_dir.glob("*/attempt_*"), key=lambda p: int(p.name.split("_")[1]))
    if not attempts:
        return {}
    found = {}
    for path in attempts[-1].glob("*/error.json"):
        try:
            data = json.loads(path.read_text())
            message = data["message"]
            stamp = message["extraInfo"]["timestamp"] if isinstance(message, dict) else 0
            found[int(path.parent.name)] = (_message_text(message), int(stamp))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a half-written file from a killed worker tells us nothing
    return found


def install_error_file_hook() -> None:
    """Record an uncaught exception in torch elastic's error file before the worker exits.

    A no-op outside an elastic launch (no ``TORCHELASTIC_ERROR_FILE``). The previous
    excepthook still runs, so the traceback is printed as usual.

    Example:
        >>> install_error_file_hook()
    """
    if "TORCHELASTIC_ERROR_FILE" not in os.environ or getattr(sys.excepthook, "_ddpkit", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            stack = "".join(traceback.format_exception(kind, exc, tb))
            mismatch = summarize_mismatch(str(exc))
            if mismatch:  # torch's own text is one 1,000-character line; lead with the gist
                print(f"ddpkit: {mismatch}", file=sys.stderr, flush=True)
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
        >>> record_failure("hang: rank 1 did not reach all_reduce", "...")  # no launcher
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    # The same layout torch's record() writes, so torch's agent can read it too.
    data = {
        "message": {
            "message": message,
            "extraInfo": {"py_callstack": details, "timestamp": str(int(time.time()))},
        }
    }
    with contextlib.suppress(OSError):  # reporting the failure must never hide it
        Path(path).write_text(json.dumps(data))


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
