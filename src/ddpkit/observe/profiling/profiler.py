"""Profiling a window of steps on every rank (or some), as one timeline and one summary.

The observer tells :class:`RankProfiler` each optimizer step. When a window begins, each
profiled rank starts torch.profiler (CPU, and CUDA on a GPU; no shapes, stacks or memory
unless asked) and taps the step clock for its phases. When it ends, every profiled rank and
rank 0 measure their clocks against rank 0's (:mod:`ddpkit.observe.profiling.clocksync`); each rank
writes its trace, named by host and rank, with torch's ``distributedInfo`` and ddpkit's
metadata, cut to the size cap, adds its phase track and sums its window
(:mod:`ddpkit.observe.profiling.summary`), then sends both to rank 0 through the store. Rank 0
writes ``merged.json`` (one track per rank, on its clock: :mod:`.chrometrace`)
and the summary, and says where they are.

A window is set by ``ddpkit run --profile`` / ``profile=`` or asked of a running job: a file
named ``request`` in the profile folder (optionally holding a number of steps) arms the
next window when the ranks next share their times (every ``log_every`` or 50 steps).

Example::

    profiler = RankProfiler(ProfileSpec.parse("11-15"), clock, Path("ddpkit-profile"))
    profiler.step_done(step, latest_times, collective=True)   # after each optimizer step
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed import Store
from torch.profiler import ProfilerAction, ProfilerActivity, profile

from ddpkit._core.atomicfile import atomic_write
from ddpkit._core.log import logger
from ddpkit._core.protocol import PROFILE_DIR_ENV
from ddpkit._core.stepwindow import DEFAULT_COUNT
from ddpkit.checkpoint.redirect import resolve_log_dir
from ddpkit.observe.profiling import chrometrace
from ddpkit.observe.profiling import summary as profilesummary
from ddpkit.observe.profiling.clocksync import measure_offset, skew_ns, wall_ns
from ddpkit.observe.profiling.spec import ProfileSpec
from ddpkit.observe.ranktimes import RankTimes
from ddpkit.observe.steptime import Phase, StepClock
from ddpkit.runtime.session import current_world

DEFAULT_FOLDER = "ddpkit-profile"
REQUEST_FILE = "request"  # in the profile folder: profile the next window of a running job
_WAIT_S = 120.0  # rank 0 waits this long for a profiled rank's trace


def profile_folder(log_dir: str | os.PathLike[str] | None) -> Path:
    """Where a run's profiles go: ``$DDPKIT_PROFILE_DIR``, else ``<log_dir>/profile``, else
    ``./ddpkit-profile``; under ``ddpkit verify``, ``bench`` or ``doctor --run``, in their
    scratch folder, as the logs (they never write into the user's folders).

    Example:
        >>> profile_folder("runs/a").as_posix().endswith("runs/a/profile")
        True
    """
    chosen = os.environ.get(PROFILE_DIR_ENV)
    if chosen:
        return Path(chosen).absolute()
    folder = Path(log_dir) / "profile" if log_dir is not None else Path(DEFAULT_FOLDER)
    return resolve_log_dir(folder).absolute()


class RankProfiler:
    """One rank's part in the run's profiled windows (see the module's docstring)."""

    def __init__(self, spec: ProfileSpec | None, clock: StepClock, folder: Path) -> None:
        self.spec, self.clock, self.folder = spec, clock, folder
        self.world = current_world()
        self.host = socket.gethostname()
        self.writing_s = 0.0  # how long the last window's end took here (stop to merged)
        self.window: ProfileSpec | None = None  # the window open now (None: none)
        self._ranks: list[int] = []
        self._torch: profile | None = None
        self._phases: list[tuple[str, int, int, int]] = []
        self._step = 0
        self._anchor_ns = 0  # wall clock minus perf_counter, for the clock's phase times
        self._main_tid = 0

    def asked(self) -> bool:
        """Whether a ``request`` file asks this job for a window now (the file is taken)."""
        request = self.folder / REQUEST_FILE
        if not request.exists():
            return False
        with contextlib.suppress(OSError):  # another rank of this host took it first
            request.unlink()
        return True

    def requested(self, step: int) -> None:
        """A rank asked for a window: it starts with the next step (all ranks agree)."""
        if self.window is not None:
            return
        base = self.spec or ProfileSpec(1, DEFAULT_COUNT)
        self.spec = base.moved_to(step + 1)
        logger.info(f"profiling {self.spec.describe()} on request ({self.folder / REQUEST_FILE})")

    def step_done(self, step: int, latest: RankTimes | None, collective: bool) -> None:
        """After optimizer step ``step`` (and with the run's step before its first): open
        the window that starts next, close the one that ended."""
        self._step = step + 1  # the phases that follow belong to the next step
        window, recorder = self.window, self._torch
        if recorder is not None and window is not None and step < window.last:
            recorder.step()  # torch's ProfilerStep#N ranges (HTA's iterations) follow ours
        if self.window is not None and step >= self.window.last:
            self._finish(self.window)
        elif (  # a window that starts next, or is under way (a resume): no call a step
            self.window is None
            and collective
            and (spec := self.spec) is not None
            and spec.first - 1 <= step < spec.last
        ):
            self._start(spec, latest)

    def close(self) -> None:
        """The run ends: a window still open is written with the steps it holds."""
        if self.window is not None:
            self._finish(self.window)

    def _start(self, window: ProfileSpec, latest: RankTimes | None) -> None:
        self.window, self.spec = window, None
        self._ranks = _chosen_ranks(window, latest, self.world.world_size)
        if self.world.rank not in self._ranks:
            return
        activities = [ProfilerActivity.CPU]
        if self.world.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        # kineto prints a notice at every start and stop (and CUDA errors on a CPU machine) to
        # stderr, each rank, unless told otherwise before its first profile; yours is kept
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        self._torch = profile(activities=activities, with_stack=window.stacks,
                              profile_memory=window.memory, record_shapes=False,
                              schedule=_every_step)  # fmt: skip
        self._phases = []
        self._anchor_ns = wall_ns() - time.perf_counter_ns()
        self._main_tid = threading.get_native_id()
        self._torch.step_num = self._step  # its ProfilerStep#N counts as the loop does
        self._torch.start()
        self.clock.tap = self._tap

    def _tap(self, phase: Phase, start: float, end: float) -> None:
        """The step clock's interval of ``phase`` (perf_counter seconds) on the wall clock."""
        to_ns = self._anchor_ns
        interval = (to_ns + int(start * 1e9), to_ns + int(end * 1e9))
        self._phases.append((phase.value, self._step, *interval))

    def _finish(self, window: ProfileSpec) -> None:
        self.window, self.clock.tap = None, None
        started = time.perf_counter()
        if self._torch is not None:
            self._torch.stop()
        store, prefix = _job_store(), _prefix(window)
        offset = measure_offset(store, self.world.rank, sorted({0, *self._ranks}), prefix)
        folder = self.folder / f"steps-{window.first}-{window.last}"
        mine = self._own_or_none(folder, window, offset)
        self._torch = None
        if self.world.rank == 0:
            self._merge(folder, window, store, prefix, mine, started)
        elif mine is not None and store is not None:
            payload = gzip.compress(json.dumps(mine).encode())
            store.set(f"{prefix}/trace/{self.world.rank}", payload)  # type: ignore[arg-type]
        self.writing_s = time.perf_counter() - started

    def _own_or_none(self, folder: Path, window: ProfileSpec, offset: int) -> dict[str, Any] | None:
        """This rank's part, or None when it profiled nothing or could not write (a full
        disk, a folder it may not write): a profile never stops the training."""
        if self._torch is None:
            return None
        try:
            return self._write_own(folder, window, offset)
        except OSError as error:
            logger.warning(f"profile: rank {self.world.rank} could not write its trace in "
                           f"{folder}: {error}; training goes on without it")  # fmt: skip
            return None

    def _write_own(self, folder: Path, window: ProfileSpec, offset_ns: int) -> dict[str, Any]:
        """This rank's trace file and summary, as sent to rank 0."""
        assert self._torch is not None
        trace = _exported(self._torch)
        chrometrace.shift(trace, skew_ns() / 1000)  # tests: the skewed clock wrote it
        events = list(trace.get("traceEvents", []))
        pid = next((int(e["pid"]) for e in events if e.get("cat") == "cpu_op"), os.getpid())
        trace["traceEvents"] = events + chrometrace.phase_events(self._phases, pid, trace)
        trace["ddpkit"] = {"rank": self.world.rank, "host": self.host,
                           "steps": [window.first, window.last],
                           "clock_offset_us": offset_ns / 1000, "dropped_events": 0}  # fmt: skip
        chrometrace.cap(trace, int(window.max_mb * 2**20))  # counts what it drops in "ddpkit"
        (folder / "ranks").mkdir(parents=True, exist_ok=True)  # alone: what HTA reads
        _write_json(folder / "ranks" / f"{self.host}-rank{self.world.rank}.json", trace)
        summary = profilesummary.rank_profile(
            self.world.rank, self.host, self._phases, events, self._main_tid,
            chrometrace.base_us(trace),
        )  # fmt: skip
        return {"summary": summary.to_json(), "trace": trace, "offset_ns": offset_ns}

    def _merge(self, folder: Path, window: ProfileSpec, store: Store | None, prefix: str,
               mine: dict[str, Any] | None, started: float) -> None:  # fmt: skip
        sent = {0: mine} if mine is not None else {}
        for rank in (r for r in self._ranks if r != 0):
            received = _receive(store, f"{prefix}/trace/{rank}")
            if received is None:
                logger.warning(f"profile: rank {rank} sent no trace within {_WAIT_S:.0f} s; "
                               "the merged timeline leaves it out")  # fmt: skip
            else:
                sent[rank] = received
        if not sent:
            return
        try:
            self._write_merged(folder, window, sent, time.perf_counter() - started)
        except OSError as error:
            logger.warning(f"profile: could not write the merged timeline in {folder}: "
                           f"{error}; training goes on without it")  # fmt: skip

    def _write_merged(self, folder: Path, window: ProfileSpec, sent: dict[int, dict[str, Any]],
                      took_s: float) -> None:  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        ranks = sorted(sent)
        traces = [chrometrace.TraceOf(r, sent[r]["trace"]["ddpkit"]["host"], sent[r]["trace"],
                                    int(sent[r]["offset_ns"])) for r in ranks]  # fmt: skip
        _write_json(folder / "merged.json", chrometrace.merge(traces))
        profiles = [profilesummary.RankProfile.from_json(sent[r]["summary"]) for r in ranks]
        what = window.describe()
        profilesummary.write_csv(folder / "summary.csv", profiles)
        text = profilesummary.summary_text(profiles, what)
        (folder / "summary.txt").write_text(text + "\n")
        skipped = profilesummary.draw(folder / "summary.png", profiles, what)
        logger.info(f"{text}\nprofile: one timeline of ranks {','.join(map(str, ranks))} in "
                    f"{folder / 'merged.json'} (open it in https://ui.perfetto.dev); "
                    f"summary.csv{'' if skipped else ', summary.png'} beside it; "
                    f"writing it took {took_s:.1f} s")  # fmt: skip
        if skipped:
            logger.info(skipped)


def _every_step(_step: int) -> ProfilerAction:
    """Record every step of the window: torch's own default, but one given marks each step
    in the trace (ProfilerStep#N, what HTA counts iterations by)."""
    return ProfilerAction.RECORD


def _chosen_ranks(window: ProfileSpec, latest: RankTimes | None, world_size: int) -> list[int]:
    """The ranks ``window`` profiles; ``"slow"``: the straggler and the median rank."""
    if window.ranks == "all":
        return list(range(world_size))
    if window.ranks == "slow":
        straggler = latest.straggler() if latest is not None else None
        if straggler is None:
            logger.info("profile: the straggler report names no slow rank yet; every rank then")
            return list(range(world_size))
        work = latest.work_ms() if latest is not None else []
        others = sorted((w, r) for r, w in enumerate(work) if r != straggler.rank)
        return sorted({straggler.rank, others[len(others) // 2][1]})
    listed = () if isinstance(window.ranks, str) else window.ranks  # the ranks themselves
    chosen = [rank for rank in listed if rank < world_size]
    if len(chosen) < len(listed):
        logger.warning(f"profile: ranks past the world's {world_size} are left out")
    return chosen


def _exported(torch_profile: profile) -> dict[str, Any]:
    """The profile as torch writes it (Chrome trace JSON), read back as a dict."""
    with tempfile.TemporaryDirectory(prefix="ddpkit-profile-") as scratch:
        path = os.path.join(scratch, "trace.json")
        torch_profile.export_chrome_trace(path)
        with open(path) as raw:
            trace: dict[str, Any] = json.load(raw)
    return trace


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Written whole or not at all: a reader never opens half a trace."""
    # json.dumps: json.dump is the slow encoder. Its default ': ' stays: HTA finds a file's
    # rank with the pattern '"rank":\s+N' (hta/common/trace_file.py)
    text = json.dumps(data).encode()
    atomic_write(path, lambda out: out.write(text))


def _job_store() -> Store | None:
    """The job's store (the default group's; torch keeps no public handle), or None."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.distributed_c10d._get_default_store()


def _prefix(window: ProfileSpec) -> str:
    """Keys of one window in one restart attempt (a restarted job reuses the store)."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"ddpkit/profile/{attempt}/{window.first}"


def _receive(store: Store | None, key: str) -> dict[str, Any] | None:
    if store is None:
        return None
    try:
        store.wait([key], timedelta(seconds=_WAIT_S))
        data: dict[str, Any] = json.loads(gzip.decompress(bytes(store.get(key))))
    except (RuntimeError, OSError, ValueError):  # a timeout, a store gone, a broken payload
        return None
    with contextlib.suppress(RuntimeError, NotImplementedError):  # a store without deletes
        store.delete_key(key)
    return data
