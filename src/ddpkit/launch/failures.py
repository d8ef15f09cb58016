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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ddpkit._core.protocol import (
    HANG_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    SAME_CALLS_FIX,
    RecordKind,
    error_call,
    error_collectives,
    error_exitcode,
    error_headline,
    error_kind,
    error_text,
    error_timestamp,
)
from ddpkit._core.text import ranks_text
from ddpkit.errors import WorkerFailedError
from ddpkit.flightrecorder.verdict import collective_verdict

# What a worker reports when a *peer* died: a consequence, not the cause.
_ECHOES = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote worker crashing",
    "communicator was aborted",
)
_NO_DETAIL = (
    "no Python error was recorded (os._exit, or a crash in native code); see the worker's "
    "output above"
)
# torch's own words for the two signals users meet most, and what usually sent them.
_SIGNAL_HINTS = {
    -signal.SIGKILL: "SIGKILL comes from `kill -9` or the kernel's OOM killer: check "
    "`dmesg | grep -i 'out of memory'` and the job's memory limit",
    -signal.SIGSEGV: "a crash in native code (a CUDA/NCCL driver mismatch, a bad extension)",
}


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
    headline: str = ""
    call: str | None = None  # the torch/ddpkit call the user's code was in
    kind: RecordKind = RecordKind.ERROR
    collectives: tuple[dict[str, Any], ...] = ()  # its last ones (torch's Flight Recorder)
    stopped_while_failing: bool = False  # ended 75 by ddpkit's SIGTERM handler, its error kept

    @property
    def stopped(self) -> bool:
        """True when a signal stopped this worker (SIGTERM's default, or ddpkit's exit 75):
        the agent's doing when another worker failed, or a preemption when all were. A
        worker stopped while it was failing keeps its own error as its record and its
        error's exit code (the job must not end 75, which asks a scheduler to requeue it),
        and counts as stopped: a peer that ended by itself with the same error is the cause."""
        stop_codes = (-signal.SIGTERM, PREEMPTED_EXIT_CODE)
        return (
            self.exitcode in stop_codes
            or self.kind is RecordKind.PREEMPTED
            or self.stopped_while_failing
        )

    @property
    def finished(self) -> bool:
        """True when this worker had finished the script and failed while exiting (the
        agent stopped it there because a peer failed, or the teardown crashed)."""
        return self.kind is RecordKind.FINISHED

    @property
    def summary(self) -> str:
        """One line: the recorded headline, or the text's last line (the exception)."""
        lines = [line for line in self.text.splitlines() if line.strip()]
        return self.headline or (lines[-1].strip() if lines else _NO_DETAIL)

    @property
    def is_echo(self) -> bool:
        """True when this worker only failed because a peer died (or answered a peer's hang
        report)."""
        return self.kind is RecordKind.HANG_ANSWER or is_echo(self.text)


def is_echo(text: str) -> bool:
    """True for errors that report a dead peer rather than a cause of their own.

    Example:
        >>> is_echo("ValueError: bad shape")
        False
    """
    lowered = text.lower()
    return any(echo in lowered for echo in _ECHOES)


@dataclass(frozen=True)
class Diagnosis:
    """Why a launch failed: the worker to blame, the other failed ones, the ranks that had
    finished the script.

    Example:
        >>> cause = Failure(rank=1, exitcode=1, text="ValueError: x", timestamp=0)
        >>> print(Diagnosis(cause, others=[], finished=[]).error())
        worker rank 1 failed (exit code 1):
        ValueError: x
    """

    cause: Failure
    others: list[Failure]
    finished: list[int]

    def error(self) -> WorkerFailedError:
        """The cause's text once, then a line per thing that happened to the other failed
        ranks, naming the ranks it happened to (64 ranks that failed when a peer left are
        one line, not 64)."""
        cause = self.cause
        same = [f for f in self.others if f.summary == cause.summary and not f.is_echo]
        happened: dict[str, list[int]] = {}
        for failure in self.others:
            if failure not in same:
                happened.setdefault(_what_happened(failure, cause), []).append(failure.rank)
        lines = [cause.text] + [
            f"{ranks_text(sorted(ranks), most=_LISTED)}: {text}" for text, ranks in happened.items()
        ]
        failed = [cause, *self.others]
        hang = any(f.kind in (RecordKind.HANG, RecordKind.HANG_ANSWER) for f in failed)
        verdict = (
            None
            if hang
            else collective_verdict(  # a hang report has its own line
                {f.rank: {"collectives": list(f.collectives)} for f in failed},
                pending_only=False,
                aborted=tuple(f.rank for f in failed if f.exitcode == -signal.SIGABRT),
            )
        )
        if verdict is not None:  # what their Flight Recorders say of the collectives
            lines[:0] = [f"collectives: {verdict.line}", f"fix: {verdict.fix}"]
        return WorkerFailedError(
            rank=cause.rank,
            # a reported hang ends the job with its own code, whatever the reporting rank's
            # exit raced with (a peer gone first fails its collective): policies act on it
            exitcode=HANG_EXIT_CODE if cause.kind is RecordKind.HANG else cause.exitcode,
            detail="\n".join(lines),
            headline=_headline(cause, same, self.finished),
            # every failure here echoes a peer's, and no rank here finished early (a rank that
            # skipped a collective is a bug in the script): the cause is on another node
            peer_lost=cause.is_echo
            and cause.kind is not RecordKind.HANG_ANSWER
            and not self.finished,
        )


_LISTED = 8  # ranks named per line; a 1,000-rank job's report stays readable


def diagnose(
    err: ChildFailedError, log_dir: str | os.PathLike[str], local_world: int | None = None
) -> Diagnosis:
    """Which worker is to blame for ``err``, from torch's records and every error file.

    ``local_world`` (this node's worker count) lets it tell which ranks finished the script
    normally: a rank that waited in a collective for one of them made the classic mistake.

    Example::

        diagnose(child_failed, "/tmp/logs", 2).cause.rank   # the worker whose error is the cause
    """
    failures = _all_failures(err, Path(log_dir))
    cause, *others = sorted(failures, key=_blame_order)
    return Diagnosis(cause, others, _finished_ranks(err, failures, local_world))


def root_cause(
    err: ChildFailedError, log_dir: str | os.PathLike[str], local_world: int | None = None
) -> WorkerFailedError:
    """The worker to blame for ``err``, as the WorkerFailedError the user is shown.

    Example::

        root_cause(child_failed, "/tmp/logs", 2).rank   # the worker whose error is the cause
    """
    return diagnose(err, log_dir, local_world).error()


def _headline(cause: Failure, same: list[Failure], finished: list[int]) -> str | None:
    """The summary's first line where it can say more than "worker rank N failed"."""
    if cause.finished:  # every failed rank had finished: the teardown failed
        return f"rank {cause.rank} finished the script, then failed while exiting"
    if cause.is_echo and finished:
        who = ranks_text(finished)
        waited = f"waited in {cause.call}" if cause.call else "was in a collective call"
        return (
            f"rank {cause.rank} {waited} but {who} finished the script without calling "
            f"it: {SAME_CALLS_FIX}"
        )
    if same:
        ranks = ranks_text(sorted([cause.rank, *(f.rank for f in same)]), most=_LISTED)
        return f"{ranks} failed with the same error ({_how(cause.exitcode)})"
    return None


def _what_happened(failure: Failure, cause: Failure) -> str:
    """What happened to a rank that failed too, but is not the one to blame."""
    if failure.finished:
        return f"finished the script ({_how(failure.exitcode)} while exiting)"
    if failure.stopped:
        return f"stopped by the launcher after rank {cause.rank} failed"
    if failure.is_echo:  # torch's words for it are a paragraph ending in "GLHF!"
        where = f" while in {failure.call}" if failure.call else ""
        return f"failed when a peer left{where}"
    return f"{failure.summary} ({_how(failure.exitcode)})"


def _finished_ranks(
    err: ChildFailedError, failures: list[Failure], local_world: int | None
) -> list[int]:
    """This node's ranks that finished the script: those not among the failed (they exited 0
    before the failure) and those the agent stopped while they were exiting."""
    if not local_world or not err.failures:
        return []
    first = next(rank - pf.local_rank for rank, pf in err.failures.items())
    failed = {f.rank for f in failures if not f.finished}
    return [rank for rank in range(first, first + local_world) if rank not in failed]


def _how(exitcode: int) -> str:
    return f"killed by signal {-exitcode}" if exitcode < 0 else f"exit code {exitcode}"


def recorded(log_dir: str | os.PathLike[str]) -> list[Recorded]:
    """What each worker of the newest attempt recorded in its error file, by local rank.

    Example:
        >>> recorded("/nonexistent")
        []
    """
    found = read_error_files(Path(log_dir))
    return [found[rank] for rank in sorted(found)]


def _blame_order(f: Failure) -> tuple[bool, bool, bool, bool, bool, int, int]:
    # A hang report names the rank at fault itself. When one worker dies the agent sends
    # SIGTERM to the others within the same second (timestamps are whole seconds), so a
    # worker stopped by a signal is the agent's doing unless nothing else failed.
    report = f.kind is RecordKind.HANG
    return (not report, f.finished, f.is_echo, f.stopped, f.text == _NO_DETAIL, f.timestamp,
            f.rank)  # fmt: skip


def _all_failures(err: ChildFailedError, log_dir: Path) -> list[Failure]:
    reported = {rank: _from_process_failure(rank, pf) for rank, pf in err.failures.items()}
    rank_offset = next((rank - pf.local_rank for rank, pf in err.failures.items()), 0)
    for local_rank, found in read_error_files(log_dir).items():
        rank = local_rank + rank_offset
        if found.kind.is_state:  # where it was, not how it failed
            if rank in reported and found.kind is RecordKind.FINISHED:  # failed while exiting
                reported[rank] = replace(reported[rank], text=found.text, kind=found.kind)
            continue  # not reported: it exited 0
        # A worker that recorded its error failed with it (exit code 1, or its sys.exit code),
        # even when the agent's SIGTERM reached it while it was still exiting: killed by it,
        # or ended 75 by ddpkit's handler (fc28: the job, caused by this rank, ended 75).
        exitcode = reported[rank].exitcode if rank in reported else -1
        stopped = exitcode == PREEMPTED_EXIT_CODE and found.kind is not RecordKind.PREEMPTED
        exitcode = exitcode if exitcode > 0 and not stopped else (found.exitcode or 1)
        reported[rank] = Failure(rank, exitcode, found.text, found.timestamp, found.headline,
                                 found.call, found.kind, tuple(found.collectives),
                                 stopped)  # fmt: skip
    return list(reported.values())


def _from_process_failure(rank: int, failure: ProcessFailure) -> Failure:
    # torch describes a signal death itself when the worker left no error file; a state
    # record it read instead (training, finished) tells nothing of the death, so say it as torch.
    stated = isinstance(failure.message, dict) and error_kind(failure.message).is_state
    text = _death_text(failure) if stated else _message_text(failure.message)
    hint = _SIGNAL_HINTS.get(failure.exitcode)
    text = f"{text} ({hint})" if text and hint else text
    return Failure(rank, failure.exitcode, text or _NO_DETAIL, int(failure.timestamp))


def _death_text(failure: ProcessFailure) -> str:
    if failure.exitcode >= 0:
        return ""
    name = signal.Signals(-failure.exitcode).name
    return f"Signal {-failure.exitcode} ({name}) received by PID {failure.pid}"


def _message_text(message: Any) -> str:
    # Without an error file torch substitutes a link to its docs: no information.
    if not isinstance(message, dict) and "pytorch.org" in str(message):
        return ""
    return error_text(message)


@dataclass(frozen=True)
class Recorded:
    """What one worker wrote in its error file, its kind parsed.

    Example:
        >>> Recorded("stopped by SIGTERM", 0, "stopped by SIGTERM", None, 75,
        ...          RecordKind.PREEMPTED).kind.value
        'preempted'
    """

    text: str
    timestamp: int
    headline: str
    call: str | None
    exitcode: int | None
    kind: RecordKind
    collectives: list[dict[str, Any]] = field(default_factory=list)


def read_error_files(log_dir: Path) -> dict[int, Recorded]:
    """``{local_rank: what it recorded}`` from the newest restart attempt's error files.

    Example:
        >>> read_error_files(Path("/nonexistent"))
        {}
    """
    attempts = sorted(log_dir.glob("*/attempt_*"), key=lambda p: int(p.name.split("_")[1]))
    if not attempts:
        return {}
    found = {}
    for path in attempts[-1].glob("*/error.json"):
        try:
            message = json.loads(path.read_text())["message"]
            found[int(path.parent.name)] = Recorded(
                _message_text(message),
                error_timestamp(message),
                error_headline(message),
                error_call(message),
                error_exitcode(message),
                error_kind(message),
                error_collectives(message),
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a half-written file from a killed worker tells us nothing
    return found
