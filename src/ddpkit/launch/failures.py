"""Reading worker failures in the launcher, and deciding which worker is to blame.

torch's elastic agent gives each worker an error file (``TORCHELASTIC_ERROR_FILE``) and reads
it back when the worker fails; workers write it through :mod:`ddpkit.runtime.errorfile`, in
the layout of :mod:`ddpkit._core.protocol`. The agent itself reports only some of the failed
workers, and when one worker dies its peers fail within the same second with "Connection
closed by peer": so the launcher reads every worker's error file and blames the one whose
error is not such an echo.

Example:
    >>> is_echo("RuntimeError: Connection closed by peer [127.0.0.1]:4242")
    True
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ddpkit._core.protocol import (
    HANG_ANSWER,
    HANG_MARKER,
    PREEMPTED_MARKER,
    error_text,
    error_timestamp,
)
from ddpkit.errors import WorkerFailedError

# What a worker reports when a *peer* died: a consequence, not the cause.
_ECHOES = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote worker crashing",
    "communicator was aborted",
    HANG_ANSWER,  # a rank that answered another rank's hang report
)
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

    Example::

        root_cause(child_failed, "/tmp/logs").rank   # the worker whose error is not an echo
    """
    failures = _all_failures(err, Path(log_dir))
    ranked = sorted(failures, key=_blame_order)
    cause = ranked[0]
    others = [f"rank {f.rank}" + (" after its peer died" if f.is_echo else "") for f in ranked[1:]]
    detail = cause.text + (f"\n(also failed: {', '.join(others)})" if others else "")
    return WorkerFailedError(rank=cause.rank, exitcode=cause.exitcode, detail=detail)


def preemption_message(text: str) -> str | None:
    """The message of a worker's preemption record, or None for any other failure.

    Example:
        >>> preemption_message("preempted: stopped by SIGTERM at the end of epoch 3")
        'stopped by SIGTERM at the end of epoch 3'
    """
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first.removeprefix(PREEMPTED_MARKER) if first.startswith(PREEMPTED_MARKER) else None


def error_file_texts(log_dir: str | os.PathLike[str]) -> list[str]:
    """What each worker of the newest attempt recorded in its error file, by local rank.

    Example:
        >>> error_file_texts("/nonexistent")
        []
    """
    found = _read_error_files(Path(log_dir))
    return [found[rank][0] for rank in sorted(found)]


def _blame_order(f: Failure) -> tuple[bool, bool, bool, bool, int, int]:
    # A hang report names the rank at fault itself. When one worker dies the agent sends
    # SIGTERM to the others within the same second (timestamps are whole seconds), so a
    # SIGTERM death is the agent's doing unless nothing else failed.
    report = f.text.startswith(HANG_MARKER)
    stopped_by_agent = f.exitcode == -signal.SIGTERM
    return (not report, f.is_echo, stopped_by_agent, f.text == _NO_DETAIL, f.timestamp, f.rank)


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
    # Without an error file torch substitutes a link to its docs: no information.
    if not isinstance(message, dict) and "pytorch.org" in str(message):
        return ""
    return error_text(message)


def _read_error_files(log_dir: Path) -> dict[int, tuple[str, int]]:
    """``{local_rank: (text, timestamp)}`` from the newest restart attempt's error files."""
    attempts = sorted(log_dir.glob("*/attempt_*"), key=lambda p: int(p.name.split("_")[1]))
    if not attempts:
        return {}
    found = {}
    for path in attempts[-1].glob("*/error.json"):
        try:
            message = json.loads(path.read_text())["message"]
            found[int(path.parent.name)] = (_message_text(message), error_timestamp(message))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a half-written file from a killed worker tells us nothing
    return found
