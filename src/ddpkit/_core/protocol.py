"""The protocol between launchers and workers, defined once: variables, exit codes, error files.

A launcher (``ddpkit run``, ``ddpkit.spawn``, or one of ddpkit's commands starting a child
job) talks to its workers through environment variables; the workers answer through their
exit codes and through torch elastic's error file, whose record carries a :class:`RecordKind`
that tells the launcher what kind of stop it was (a failure, a hang report, a preemption, or
a state: training or finished). Both sides import the names from here, so a kind written in
one place is read by the same enum in the other.

Example:
    >>> record = error_record("rank 1 did not reach all_reduce", "the report", kind=RecordKind.HANG)
    >>> error_kind(record["message"]), error_text(record["message"])
    (<RecordKind.HANG: 'hang'>, 'the report')
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ddpkit._core.atomicfile import atomic_write

# torch's customary MASTER_PORT: torchrun's, the Kubeflow Trainer's and TorchX's default
DEFAULT_MASTER_PORT = 29500

# --- exit codes -------------------------------------------------------------------------
PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): checkpointed and stopped; run again
HANG_EXIT_CODE = 124  # as coreutils' timeout: the job was stopped for taking too long
# EX_UNAVAILABLE (sysexits.h): this node's workers failed only because a peer (another node)
# went away, or the nodes could not meet: worth retrying, unlike a bad script or setting.
PEER_LOST_EXIT_CODE = 69
CONFIG_EXIT_CODE = 2  # ddpkit refused a setting or the command line: fix it, do not retry

# What a rank that waited for a rank that left is told, by the launcher and the watchdog.
SAME_CALLS_FIX = (
    "every rank must make the same collective calls in the same order (evaluating or "
    "saving on rank 0 only? an early return or one batch fewer on one rank?)"
)

# --- the user's knobs: documented (docs/fault-tolerance.md, docs/training.md) -------------
HANG_TIMEOUT_ENV = "DDPKIT_HANG_TIMEOUT"  # seconds; `ddpkit run --hang-timeout`
FULL_TRACEBACK_ENV = "DDPKIT_FULL_TRACEBACK"  # 1: keep ddpkit's own frames in tracebacks
CHECK_REPLICAS_ENV = "DDPKIT_CHECK_REPLICAS_EVERY"  # compare replicas every M steps
PROFILE_ENV = "DDPKIT_PROFILE"  # `ddpkit run --profile STEPS`: the window, for every worker
PROFILE_RANKS_ENV = "DDPKIT_PROFILE_RANKS"  # all | slow | 0,3
PROFILE_STACKS_ENV = "DDPKIT_PROFILE_STACKS"  # 1: Python stacks (and Python calls) too
PROFILE_MEMORY_ENV = "DDPKIT_PROFILE_MEMORY"  # 1: tensor allocations and frees too
PROFILE_MAX_MB_ENV = "DDPKIT_PROFILE_MAX_MB"  # each rank's trace is cut to this size
PROFILE_DIR_ENV = "DDPKIT_PROFILE_DIR"  # where profiles go (and where a request file asks)
FLIGHT_RECORDER_ENV = "DDPKIT_FLIGHT_RECORDER"  # 0: do not arm torch's Flight Recorder
DNS_TIMEOUT_ENV = "DDPKIT_DNS_TIMEOUT"  # seconds the master's name may take to resolve
GRACE_PERIOD_ENV = "DDPKIT_GRACE_PERIOD"  # the pod's terminationGracePeriodSeconds (ddpkit k8s)

# --- internal channels: a launcher or a ddpkit command steers its workers (each one's setter
# and reader: docs/architecture.md, "The internal channels"); not for users to set ----------
LAUNCHER_PID_ENV = "DDPKIT_LAUNCHER_PID"  # workers die with this process (lifeline)
STDIN_LIFELINE_ENV = "DDPKIT_STDIN_LIFELINE"  # 1: ddpkit run stops its job at stdin's end (ssh)
WARM_SERVER_ENV = "DDPKIT_WARM_SERVER"  # the launcher's pid, in the warm server it started
WORKER_SETUP_ENV = "DDPKIT_WORKER_SETUP"  # "module:function" run before the script
LAUNCHER_REPORTS_ENV = "DDPKIT_LAUNCHER_REPORTS"  # 1: the launcher prints the traceback once
ONE_STREAM_ENV = "DDPKIT_ONE_STREAM"  # 1: stderr into stdout's file, in the order written
LIVE_CONSOLE_ENV = "DDPKIT_LIVE_CONSOLE"  # 1: the merged console shows a terminal: draw bars
MAX_STEPS_ENV = "DDPKIT_MAX_STEPS"  # stop every rank after K optimizer steps, exit 0
SAVE_AT_STEP_ENV = "DDPKIT_SAVE_AT_STEP"  # also checkpoint after step K (verify --then)
METRICS_ENV = "DDPKIT_METRICS_FILE"  # where rank 0 appends bench's JSON lines
VERIFY_DIR_ENV = "DDPKIT_VERIFY_DIR"  # where verify's recorder writes one run's record
PLAN_OUT_ENV = "DDPKIT_PLAN_OUT"  # where ddpkit plan's recorder writes the dry run's plan
REFERENCE_WORLD_ENV = "DDPKIT_VERIFY_AS_WORLD"  # one process standing in for N ranks
DEALING_ENV = "DDPKIT_VERIFY_DEALING"  # verify: slices each step of the groups' run trained
KILL_AT_ENV = "DDPKIT_VERIFY_KILL_AT"  # verify: a group's last rank kills itself after step K
MEMORY_SNAPSHOTS_ENV = "DDPKIT_MEMORY_SNAPSHOTS"  # ddpkit run: the job's folder in /dev/shm
SMOKE_OUT_ENV = "DDPKIT_SMOKE_OUT"  # where doctor's smoke worker writes its results
CHECKPOINT_DIR_ENV = "DDPKIT_CHECKPOINT_DIR"  # a command's scratch folder for the checkpoints
LOG_DIR_ENV = "DDPKIT_LOG_DIR"  # ... and for the experiment logs
FT_GROUP_ENV = "DDPKIT_FT_GROUP"  # this process's replica group (ReplicaGroups)
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"  # torchft's own name: where the replica groups meet
CLOCK_SKEW_ENV = "DDPKIT_TEST_CLOCK_SKEW_MS"  # tests only: this process's clock runs ahead
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"  # torch elastic's: this worker's error file
_KIND = "ddpkit_kind"  # the record's RecordKind, in the error file's extraInfo

# --- the signals that mean "stop and come back" (a preemption), not "fail" -----------------
STOP_SIGNALS = ("SIGTERM", "SIGUSR1")  # SLURM/Kubernetes preemption; SLURM's --signal=USR1@S
# The signals torch's agent takes over in the launcher and passes on to every worker (SIGUSR1
# so that SLURM's warning reaches the workers instead of killing the agent); a worker started
# from a function relays each to the processes it started (docs/torchrun.md).
FORWARDED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1")


class RecordKind(str, enum.Enum):
    """What a worker's error-file record says, written once in its own field.

    Failures (``ERROR``, ``HANG``, ``HANG_ANSWER``) and stops (``PREEMPTED``) end the worker;
    states (``TRAINING``, ``FINISHED``) are written ahead and read only if the worker then
    fails or is stopped, so the launcher knows where it was.

    Example:
        >>> RecordKind.FINISHED.is_state, RecordKind.HANG.is_state
        (True, False)
    """

    ERROR = "error"  # an exception (the traceback)
    HANG = "hang"  # the watchdog's report, from the rank that noticed
    HANG_ANSWER = "hang_answer"  # a rank that answered another rank's report
    PREEMPTED = "preempted"  # a clean stop after a checkpoint, or outside training (exit 75)
    TRAINING = "training"  # the loop was training (written when it starts)
    FINISHED = "finished"  # the script returned; the exit handlers still ran

    @property
    def is_state(self) -> bool:
        """True for a record of where the worker was, not of how it failed."""
        return self in (RecordKind.TRAINING, RecordKind.FINISHED)


def error_record(
    headline: str,
    details: str,
    timestamp: int | None = None,
    call: str | None = None,
    exitcode: int | None = None,
    kind: RecordKind = RecordKind.ERROR,
    collectives: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An error file's contents, in the layout torch's ``record()`` writes.

    ``headline`` is the first line the launcher shows; ``details`` the text it prints for
    the rank it blames (a traceback, a hang report); ``call`` the torch or ddpkit call the
    user's code was in (``"all_reduce (train.py:41)"``) and ``exitcode`` the code the worker
    exits with: extras torch ignores, for when the agent stopped the worker before it saw it.
    ``kind`` says what the record is (:class:`RecordKind`); ``collectives`` the worker's last
    collectives from torch's Flight Recorder (:mod:`ddpkit.flightrecorder.records`).

    Example:
        >>> error_record("ValueError: x", "Traceback ...", timestamp=7)["message"]["message"]
        'ValueError: x'
    """
    stamp = int(time.time()) if timestamp is None else timestamp
    extra = {"py_callstack": details, "timestamp": str(stamp), _KIND: kind.value}
    if call:
        extra["ddpkit_call"] = call
    if exitcode is not None:
        extra["ddpkit_exitcode"] = str(exitcode)
    if collectives:
        extra["ddpkit_collectives"] = json.dumps(collectives)
    return {"message": {"message": headline, "extraInfo": extra}}


def write_error_file(record: dict[str, Any], keep_existing: bool = False) -> None:
    """Write ``record`` where torch's agent reads this worker's failure; a no-op outside an
    elastic launch. ``keep_existing``: a failure or stop written first (a hang report) stays;
    a state record (training, finished) is always replaced.

    Example:
        >>> write_error_file(error_record("ValueError: x", "..."))  # no launcher: no-op
    """
    path = os.environ.get(ERROR_FILE_ENV)
    if not path or (keep_existing and not _recorded_kind(path).is_state):
        return
    # Whole or not at all: the agent parses the file once the worker has exited, and a
    # worker stopped between creating and filling it (the agent's SIGTERM lands in the
    # middle, the stop handler exits at once) left it empty: torch's agent died parsing it.
    # (A temporary of its own per write: the watchdog's thread writes here too.)
    # The folder is the launcher's: once it is gone (a launcher killed with -9, its folder
    # swept by the next launch) there is no one to read the record, and making the folder
    # again would leave it behind for good. Nor does anyone read it after a power cut: no
    # fsync, which a worker paid at every training record.
    text = json.dumps(record).encode()
    with contextlib.suppress(OSError):  # reporting the failure must never hide it
        atomic_write(Path(path), lambda out: out.write(text), make_folder=False, durable=False)


def failure_recorded() -> bool:
    """Whether this process is ending in failure: it wrote a failure to its error file (not
    a state record), or an exception went uncaught (Python sets ``sys.last_value`` before the
    exit handlers run).

    Example:
        >>> failure_recorded()
        False
    """
    path = os.environ.get(ERROR_FILE_ENV)
    if hasattr(sys, "last_value"):
        return True
    return bool(path) and not _recorded_kind(str(path)).is_state


def _recorded_kind(path: str) -> RecordKind:
    """The kind of the record at ``path``; FINISHED (a state) when there is none."""
    try:
        message = json.loads(Path(path).read_text())["message"]
    except FileNotFoundError:
        return RecordKind.FINISHED
    except (OSError, TypeError, ValueError, KeyError):
        return RecordKind.ERROR  # a record it could not read: it failed
    return error_kind(message)


def error_kind(message: Any) -> RecordKind:
    """The kind a record's ``message`` field carries (ERROR when it says none).

    Example:
        >>> error_kind(error_record("x", "y", kind=RecordKind.PREEMPTED)["message"])
        <RecordKind.PREEMPTED: 'preempted'>
    """
    extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
    try:
        return RecordKind(extra.get(_KIND, RecordKind.ERROR.value))
    except ValueError:
        return RecordKind.ERROR


def error_exitcode(message: Any) -> int | None:
    """The exit code a worker recorded with its error, if it did.

    Example:
        >>> error_exitcode(error_record("x", "y", exitcode=3)["message"])
        3
    """
    if not isinstance(message, dict):
        return None
    code = message.get("extraInfo", {}).get("ddpkit_exitcode")
    return int(code) if code is not None else None


def error_collectives(message: Any) -> list[dict[str, Any]]:
    """The last collectives a worker recorded with its error (empty when none).

    Example:
        >>> calls = [{"seq": 3, "op": "all_reduce"}]
        >>> error_collectives(error_record("x", "y", collectives=calls)["message"])
        [{'seq': 3, 'op': 'all_reduce'}]
    """
    if not isinstance(message, dict):
        return []
    text = message.get("extraInfo", {}).get("ddpkit_collectives")
    try:
        calls = json.loads(text) if text else []
    except ValueError:
        return []
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def error_call(message: Any) -> str | None:
    """The call the worker was in when it failed, from a record's ``message`` field.

    Example:
        >>> error_call(error_record("x", "y", call="all_reduce (t.py:3)")["message"])
        'all_reduce (t.py:3)'
    """
    if not isinstance(message, dict):
        return None
    call = message.get("extraInfo", {}).get("ddpkit_call")
    return str(call) if call else None


def error_text(message: Any) -> str:
    """The text a worker recorded (its details), from a record's ``message`` field.

    Example:
        >>> error_text("ValueError: x")
        'ValueError: x'
    """
    if isinstance(message, dict):
        callstack = message.get("extraInfo", {}).get("py_callstack")
        return str(callstack or message.get("message", "")).rstrip()
    return str(message)


def error_headline(message: Any) -> str:
    """The first line a worker recorded, from a record's ``message`` field.

    Example:
        >>> error_headline({"message": "stopped by SIGTERM", "extraInfo": {}})
        'stopped by SIGTERM'
    """
    text = message.get("message", "") if isinstance(message, dict) else str(message)
    return str(text).strip().split("\n", 1)[0]


def error_timestamp(message: Any) -> int:
    """When the record was written (epoch seconds; 0 when it does not say).

    Example:
        >>> error_timestamp(error_record("x", "y", timestamp=12)["message"])
        12
    """
    if not isinstance(message, dict):
        return 0
    return int(message.get("extraInfo", {}).get("timestamp", 0))
