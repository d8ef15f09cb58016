"""Hang watchdog: a stuck step or collective ends the job with a report, not a long silence.

Each rank runs one daemon thread. The training thread marks what it is doing: the loop writes
its step and stage into the watchdog's :class:`~ddpkit.runtime.position.TrainingPosition`,
and a ddpkit collective or any block under :func:`watch` is timed as an activity of its own.
When one activity outlasts the hang timeout, the rank that noticed raises an alarm in the
job's rendezvous store; every rank whose watchdog can still run answers with its state
(activity, for how long, progress, Python stack). The first rank to notice prints one report
naming the ranks that never reached the call the others wait in
(:mod:`ddpkit.runtime.hangreport`), every rank dumps its threads' stacks with faulthandler,
and all exit with :data:`HANG_EXIT_CODE`: the launcher stops the job instead of gloo waiting
30 minutes. A rank frozen in native code with the GIL held cannot answer; faulthandler's
timer, which needs no Python thread, dumps its stacks and ends it a little later.

The timeout applies to one step (data loading, forward, backward, optimizer) or collective;
it is 600 s by default (NCCL's), set by ``ddpkit.init(hang_timeout=S)`` or ``ddpkit run
--hang-timeout S``; 0 turns the watchdog off.

Example:
    >>> with watch("loading the vocabulary"):   # no watchdog running: a no-op
    ...     pass
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from torch.distributed import PrefixStore, Store

from ddpkit._core.envvars import seconds_var
from ddpkit._core.log import EVERY_RANK, logger
from ddpkit._core.protocol import ERROR_FILE_ENV, HANG_EXIT_CODE, HANG_TIMEOUT_ENV, RecordKind
from ddpkit._core.system import flush_and_exit
from ddpkit._core.tracebacks import thread_stack
from ddpkit._core.validate import check_seconds
from ddpkit.flightrecorder.records import recent_collectives
from ddpkit.runtime.errorfile import record_failure
from ddpkit.runtime.hangreport import State, compose_report, describe_activity
from ddpkit.runtime.position import TrainingPosition

DEFAULT_HANG_TIMEOUT_S = 600.0
_STORE_OP_TIMEOUT_S = 5.0  # a store that does not answer must not freeze the watchdog too
_BACKSTOP_MARGIN_S = 30.0
_ALARM, _REPORTER, _REPORTED = "alarm", "reporter", "reported"
_STDERR_FD = 2  # the process's own stderr, which the launcher captures; not pytest's proxy

_active: Watchdog | None = None
_job_store: Store | None = None  # the job's store, for other waits that watch a peer


# (label, time.monotonic() at its start), replaced whole: the watchdog's thread reads both
# together. A plain tuple: a NamedTuple's constructor is Python code, run 4 times a step.
_Activity = tuple[str, float]


class Watchdog:
    """One rank's hang watchdog; ``ddpkit.init`` starts it and ``ddpkit.shutdown`` stops it.

    Example:
        >>> dog = Watchdog(timeout_s=60, rank=0, world_size=1, store=None)
        >>> previous = dog.begin("step 1: forward")
        >>> dog.end(previous)
        >>> dog.state()["last"], dog.state()["progress"]
        ('step 1: forward', 1)
    """

    def __init__(self, timeout_s: float, rank: int, world_size: int, store: Store | None):
        self.timeout_s = timeout_s
        self.rank = rank
        self.world_size = world_size
        self.poll_s = min(5.0, max(0.2, timeout_s / 10))
        self.grace_s = max(3.0, 3 * self.poll_s)  # every live rank polls within this
        self.progress = 0  # activities begun (collectives, watch blocks); with the position's
        self.position = TrainingPosition()  # stages: equal on ranks in step
        self.exit: Callable[[int], Any] = flush_and_exit  # tests replace it
        self._store = store
        self._activity: _Activity | None = None
        self._last: str | None = None
        self._ended_at = 0.0  # when the last activity ended (time.monotonic())
        self._training_thread = threading.get_ident()
        self._backstop_armed = False
        self._stopped = threading.Event()
        self._leaving = threading.Event()  # an alarm is being handled: this rank exits 124
        self._thread = threading.Thread(target=self._run, name="ddpkit-watchdog", daemon=True)

    def begin(self, label: str) -> _Activity | None:
        """Start timing ``label``; returns the enclosing activity for :meth:`end`."""
        previous = self._activity
        self.progress += 1
        self._activity = (label, time.monotonic())
        return previous

    def end(self, previous: _Activity | None) -> None:
        """The current activity finished; the enclosing one (if any) resumes."""
        if self._activity is not None:
            self._last, self._ended_at = self._activity[0], time.monotonic()
        self._activity = previous

    def doing(self) -> _Activity | None:
        """The innermost activity running: a collective or watched block, else the batch the
        training loop's position is in (None: neither)."""
        return self._activity or self.position.activity()

    def state(self) -> State:
        """What this rank is doing now, as the report shows it (plain JSON data)."""
        activity, now, position = self.doing(), time.monotonic(), self.position
        last = position.last if position.ended_at > self._ended_at else self._last
        return {
            "doing": activity[0] if activity else None,
            "for_s": round(now - activity[1], 1) if activity else None,
            "last": last,
            "progress": self.progress + position.progress(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "stack": thread_stack(self._training_thread),
            "collectives": recent_collectives(),  # torch's Flight Recorder, when armed
        }

    def start(self) -> Watchdog:
        """Start the watchdog thread; returns self.

        Example:
            >>> dog = Watchdog(60, 0, 1, None).start(); dog.stop()
        """
        self._thread.start()
        return self

    def stop(self, finished: bool = False) -> None:
        """Stop the thread and faulthandler's timer (the job is leaving normally).

        ``finished``: this rank is done with the job (the script ended, or it left the
        process group) and says so in the store, so that a rank left waiting in a collective
        this one never called is told why in its hang report.
        """
        self._stopped.set()
        if self._thread.is_alive() and threading.get_ident() != self._thread.ident:
            self._thread.join(timeout=self._join_timeout_s())
            # A peer that left after the report made this rank's collective fail and its
            # script exit: the hang, not that echo, is this rank's outcome (and exit code).
            if self._leaving.is_set() and self._thread.is_alive():
                self.exit(HANG_EXIT_CODE)
        if finished:
            self._say_finished()
        # After the join: a poll under way could otherwise arm the timer again, and it would
        # end this process long after the job left.
        if self._backstop_armed:  # leave a timer the user armed alone
            with contextlib.suppress(Exception):
                faulthandler.cancel_dump_traceback_later()
            self._backstop_armed = False

    def _join_timeout_s(self) -> float:
        """How long stop() waits for the thread: a poll, or a whole report or answer."""
        if not self._leaving.is_set():
            return self.poll_s + _STORE_OP_TIMEOUT_S
        return self.grace_s + 2 * self.poll_s + 3 * _STORE_OP_TIMEOUT_S

    def check_once(self) -> None:
        """One look: answer another rank's alarm, or raise ours if an activity is too old."""
        if self._store_call(lambda s: s.check([_ALARM]), default=False):
            self._answer()
            return
        activity = self.doing()
        if activity is not None and time.monotonic() - activity[1] > self.timeout_s:
            self._report_hang()
            return
        limit = self.timeout_s + self.grace_s + _BACKSTOP_MARGIN_S
        if self._stopped.is_set():  # stop() may be cancelling the timer right now
            return
        if activity is not None or self._backstop_armed:
            self._backstop_armed = _arm_backstop(activity, limit)

    def _run(self) -> None:
        try:
            while not self._stopped.wait(self.poll_s):
                self.check_once()
        except Exception as err:  # a broken watchdog must never take training down with it
            logger.error(f"hang watchdog stopped: {err!r}", extra=EVERY_RANK)

    def _report_hang(self) -> None:
        self._leaving.set()
        first = self._store_call(lambda s: s.add(_ALARM, 1), default=1) == 1
        if not first:
            self._answer()
            return
        self._store_call(lambda s: s.set(_REPORTER, str(self.rank)), default=None)
        self._publish()
        started = time.monotonic()
        states, read_bytes = self._collect()
        report = compose_report(states, self.world_size, self.rank, self.timeout_s)
        report += "\n" + _gathered_line(len(states), self.world_size, read_bytes, started)
        # Under an elastic launcher the report reaches the user as the job's root cause.
        shown = report.splitlines()[0] if ERROR_FILE_ENV in os.environ else report
        logger.error(shown, extra=EVERY_RANK)
        _dump_all_stacks(self.rank)
        record_failure(report.splitlines()[0], report, RecordKind.HANG)
        self._store_call(lambda s: s.set(_REPORTED, "1"), default=None)
        self._leave()

    def _answer(self) -> None:
        self._leaving.set()
        state = self._publish()
        reporter = self._store_call(_reporter_of, default="another rank")
        line = f"rank {self.rank}: hang reported by {reporter}; here: {describe_activity(state)}"
        logger.error(line, extra=EVERY_RANK)
        _dump_all_stacks(self.rank)
        record_failure(line, line, RecordKind.HANG_ANSWER)
        deadline = timedelta(seconds=self.grace_s + 2 * self.poll_s)
        self._store_call(lambda s: s.wait([_REPORTED], deadline), default=None)
        self._leave()

    def _say_finished(self) -> None:
        state = {**self.state(), "finished": True, "stack": []}
        try:  # quietly: a store whose host already left is no news at a normal exit
            if self._store is not None:
                self._store.set(f"state/{self.rank}", json.dumps(state))
        except Exception as err:
            logger.debug(f"hang watchdog: could not say this rank finished ({err})")

    def _publish(self) -> State:
        state = self.state()
        key, text = f"state/{self.rank}", json.dumps(state)
        self._store_call(lambda s: s.set(key, text), default=None)
        return state

    def _collect(self) -> tuple[dict[int, State], int]:
        """Every rank's state that arrives within the grace period (this rank's at least),
        and the bytes read from the store for them."""
        keys = [f"state/{rank}" for rank in range(self.world_size)]
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and not self._store_call(
            lambda s: s.check(keys), default=True
        ):
            time.sleep(0.1)
        states, read_bytes = {self.rank: self.state()}, 0
        for rank in range(self.world_size):
            text = self._store_call(_state_reader(rank), default=None)
            if text is not None and rank != self.rank:
                states[rank] = json.loads(text)
                read_bytes += len(text.encode())
        return states, read_bytes

    def _store_call(self, call: Callable[[Store], Any], default: Any) -> Any:
        if self._store is None:
            return default
        try:
            return call(self._store)
        except Exception as err:  # store gone or slow: carry on with what this rank knows
            logger.warning(f"hang watchdog: the store did not answer ({err})", extra=EVERY_RANK)
            self._store = None
            return default

    def _leave(self) -> None:
        self.exit(HANG_EXIT_CODE)


def start_watchdog(
    timeout_s: float | None, rank: int, world_size: int, store: Store | None
) -> Watchdog | None:
    """Start this process's watchdog (None when the timeout is 0: turned off).

    ``store`` is the job's rendezvous store; the watchdog uses its own connection to it,
    under a prefix per restart attempt so a restarted job never sees an old alarm.

    Example:
        >>> start_watchdog(0, rank=0, world_size=1, store=None) is None
        True
    """
    global _active, _job_store
    stop_watchdog()
    timeout = resolve_hang_timeout(timeout_s)
    if timeout == 0:
        return None
    _job_store = store
    _active = Watchdog(timeout, rank, world_size, _own_connection(store)).start()
    return _active


def stop_watchdog(finished: bool = False) -> None:
    """Stop the running watchdog, if any (``ddpkit.shutdown`` calls this); ``finished``:
    this rank leaves the job normally (see :meth:`Watchdog.stop`).

    Example:
        >>> stop_watchdog()
    """
    global _active, _job_store
    if _active is not None:
        _active.stop(finished)
        _active, _job_store = None, None


def watched_connection(purpose: str) -> tuple[Store, float] | None:
    """A connection of its own to the job's store, under a prefix for ``purpose`` and this
    restart attempt, and the hang timeout: for a wait that must notice a peer that stopped
    (``main_first``). None when the watchdog is off or there is no store (one process).

    Example:
        >>> watched_connection("main_first") is None    # no watchdog running
        True
    """
    if _active is None or _job_store is None:
        return None
    connection = _own_connection(_job_store)
    assert connection is not None
    return PrefixStore(f"{purpose}/", connection), _active.timeout_s


def current_watchdog() -> Watchdog | None:
    """The running watchdog, or None.

    Example:
        >>> current_watchdog() is None
        True
    """
    return _active


@contextlib.contextmanager
def watch(label: str) -> Iterator[None]:
    """Time the block as one activity: past the hang timeout, the job reports and stops.

    For hand-written loops: ``with ddpkit.watch(f"step {i}"): ...`` makes a stuck step end
    the job with a hang report naming the ranks that are missing.

    Example:
        >>> with watch("step 1"):
        ...     pass
    """
    dog = _active
    if dog is None:
        yield
        return
    previous = dog.begin(label)
    try:
        yield
    finally:
        dog.end(previous)


def resolve_hang_timeout(value: float | None, environ: dict[str, str] | None = None) -> float:
    """The hang timeout in seconds: ``value``, else DDPKIT_HANG_TIMEOUT, else 600.

    Example:
        >>> resolve_hang_timeout(None, {HANG_TIMEOUT_ENV: "30"})
        30.0
    """
    if value is not None:
        return check_seconds("hang_timeout (0: off)", value)
    from_env = seconds_var(HANG_TIMEOUT_ENV, environ)
    return DEFAULT_HANG_TIMEOUT_S if from_env is None else from_env


def _own_connection(store: Store | None) -> Store | None:
    if store is None:
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    try:
        connection = store.clone()  # type: ignore[attr-defined]
        connection.set_timeout(timedelta(seconds=_STORE_OP_TIMEOUT_S))
    except Exception:  # a store that cannot clone: share it (its calls are serialized)
        connection = store
    return PrefixStore(f"ddpkit/hang/{attempt}/", connection)


def _state_reader(rank: int) -> Callable[[Store], str | None]:
    return lambda store: _get_if_set(store, f"state/{rank}")


def _gathered_line(answered: int, world_size: int, read_bytes: int, started: float) -> str:
    """What the report cost the rank that wrote it: the scale benchmark counts it, and a
    user of a large job sees why a report took its time.

    Example:
        >>> _gathered_line(63, 64, 81_920, time.monotonic())
        "gathered 63 of 64 ranks' states from the store (81,920 bytes in 0.0 s)"
    """
    took = time.monotonic() - started
    return (
        f"gathered {answered} of {world_size} ranks' states from the store "
        f"({read_bytes:,} bytes in {took:.1f} s)"
    )


def _reporter_of(store: Store) -> str:
    text = _get_if_set(store, _REPORTER)
    return f"rank {text}" if text is not None else "another rank"


def _get_if_set(store: Store, key: str) -> str | None:
    return bytes(store.get(key)).decode() if store.check([key]) else None


def _arm_backstop(activity: _Activity | None, limit_s: float) -> bool:
    """Arm (or, when idle, cancel) faulthandler's timer; True while it is armed.

    It fires only if the watchdog thread stops running (the GIL held in native code) while
    an activity is timed: it is re-armed every poll and cancelled when the rank is idle.
    """
    try:
        if activity is None:
            faulthandler.cancel_dump_traceback_later()
            return False
        left = limit_s - (time.monotonic() - activity[1])
        faulthandler.dump_traceback_later(max(left, 1.0), exit=True, file=_STDERR_FD)
        return True
    except (ValueError, OSError, RuntimeError, AttributeError):
        return False  # no usable stderr (an embedded interpreter): go without the backstop


def _dump_all_stacks(rank: int) -> None:
    with contextlib.suppress(ValueError, OSError, RuntimeError, AttributeError):
        logger.error(f"rank {rank}'s threads (faulthandler):", extra=EVERY_RANK)
        faulthandler.dump_traceback(file=_STDERR_FD, all_threads=True)
