"""The step clock, the ranks' figures and what rank 0 says of them, without processes."""

from __future__ import annotations

import csv
import io
import logging
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ddpkit
from ddpkit._core.protocol import LIVE_CONSOLE_ENV
from ddpkit.data.epochs import LoaderFacts
from ddpkit.observe import rankreport
from ddpkit.observe.console import Console, format_epoch
from ddpkit.observe.rankreport import RankReport, data_advice
from ddpkit.observe.ranktimes import RankTimes, times_row
from ddpkit.observe.steptime import GradsReady, Phase, StepClock, StepTimes
from ddpkit.runtime import memory
from ddpkit.runtime.memory import peak_memory_bytes, reset_peak_memory

MB = 2**20


def row(data: float, compute: float, sync: float, optimizer: float = 0.001, steps: int = 10,
        peak_mb: float = 300.0, work: float | None = None) -> list[float]:  # fmt: skip
    """One rank's row with per-step milliseconds given in seconds per step."""
    wall = (data + compute + sync + optimizer) * steps
    timed = {Phase.DATA: data * steps, Phase.COMPUTE: compute * steps,
             Phase.SYNC: sync * steps, Phase.OPTIMIZER: optimizer * steps}  # fmt: skip
    own = work if work is not None else data + compute + optimizer
    return times_row(StepTimes(steps, wall, timed, own), int(peak_mb * MB))


def test_the_clock_adds_each_moment_to_the_phase_that_ran() -> None:
    clock = StepClock([], torch.device("cpu"))
    clock.enter(Phase.DATA)
    time.sleep(0.02)
    clock.enter(Phase.COMPUTE)
    time.sleep(0.03)
    clock.enter(Phase.OPTIMIZER)
    time.sleep(0.01)
    clock.step_done()
    times = clock.totals()
    assert times.steps == 1
    assert times.seconds[Phase.DATA] == pytest.approx(0.02, abs=0.015)
    assert times.seconds[Phase.COMPUTE] == pytest.approx(0.03, abs=0.015)
    assert times.quick_work_s == pytest.approx(0.06, abs=0.02)
    assert sum(times.seconds.values()) == pytest.approx(times.wall_s)


def test_the_quicker_steps_work_lies_between_the_quickest_and_the_median_step() -> None:
    # Two steps, one quick and one held up (a loaded machine): the 25th percentile must not
    # fall below the quickest step (the default quantile method gave -17 ms of work, and a
    # straggler "inf% slower" than it, on a loaded 2-core machine).
    clock = StepClock([], torch.device("cpu"))
    for seconds in (0.001, 0.06):
        clock.enter(Phase.COMPUTE)
        time.sleep(seconds)
        clock.step_done()
    times = clock.totals()
    assert 0.001 <= times.quick_work_s <= 0.035, times.quick_work_s


def test_the_backward_splits_into_compute_and_the_wait_after_the_last_gradient() -> None:
    model = torch.nn.Linear(8, 8)
    clock = StepClock([model], torch.device("cpu"))
    clock.enter(Phase.COMPUTE)
    model(torch.ones(2, 8)).sum().backward()
    time.sleep(0.2)  # as a rank would wait in the all-reduce after its last gradient
    clock.backward_done()
    clock.step_done()
    seconds = clock.totals().seconds
    # 0.2 s: a first backward took over 30 ms on a 2-core machine at load 6 (typically ~1 ms)
    assert seconds[Phase.SYNC] >= 0.2 > seconds[Phase.COMPUTE]


def test_after_the_first_backward_one_gradient_hook_is_left() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    grads = GradsReady(list(model.parameters()), cuda=False)
    grads.arm()
    assert len(grads._handles) == 4
    model(torch.ones(1, 2)).sum().backward()
    at, _ = grads.settle(since=0.0)
    assert at is not None and len(grads._handles) == 1
    assert grads.settle(since=time.perf_counter())[0] is None  # nothing ran since
    grads.remove()
    assert grads._handles == {}


def test_a_clock_turned_off_records_nothing() -> None:
    clock = StepClock([], torch.device("cpu"))
    clock.enabled = False
    clock.enter(Phase.DATA)
    clock.step_done()
    assert clock.totals().steps == 0


def test_the_straggler_is_the_rank_with_the_most_work_and_its_phase() -> None:
    rows = [row(0.001, 0.010, 0.030), row(0.001, 0.010, 0.030), row(0.035, 0.010, 0.0)]
    straggler = RankTimes.from_rows(rows, ["a", "a", "b"]).straggler()
    assert straggler is not None
    assert (straggler.rank, straggler.phase, straggler.host) == (2, Phase.DATA, "b")
    assert straggler.describe().startswith("rank 2 (host b) is 283% slower than the median")
    assert "+34.0 ms per step waiting for data" in straggler.describe()


def test_a_rank_ten_times_as_slow_or_more_is_said_as_a_factor() -> None:
    rows = [row(0.001, 0.001, 0.0), row(0.001, 0.001, 0.0), row(1.6, 0.001, 0.0)]
    straggler = RankTimes.from_rows(rows, ["a", "a", "a"]).straggler()
    assert straggler is not None
    assert straggler.describe().startswith("rank 2 is 534 times as slow as the median rank: +1599")


THRESHOLD_CASES = [((0.010, 0.0148), False), ((0.010, 0.0152), True),
                   ((0.001, 0.0028), False), ((0.001, 0.0031), True)]  # fmt: skip


@pytest.mark.parametrize(("work", "named"), THRESHOLD_CASES)
def test_the_straggler_threshold_is_relative_and_absolute(
    work: tuple[float, float], named: bool
) -> None:
    rows = [row(0.0, w, 0.0, 0.0, work=w) for w in work]
    assert (RankTimes.from_rows(rows, ["a", "a"]).straggler() is not None) is named


def test_a_step_the_core_was_taken_from_does_not_make_a_straggler() -> None:
    # Rank 1's mean compute is high (a few preempted steps); its quicker steps are not.
    rows = [row(0.0, 0.010, 0.010, work=0.010), row(0.0, 0.020, 0.0, work=0.0105)]
    assert RankTimes.from_rows(rows, ["a", "a"]).straggler() is None


def test_one_rank_has_no_straggler_and_a_line_without_a_rank() -> None:
    times = RankTimes.from_rows([row(0.002, 0.006, 0.0)], ["a"])
    assert times.straggler() is None and times.memory_outlier() is None
    assert times.compact().endswith("peak memory 300 MB")


def test_data_bound_needs_every_rank_waiting_for_data() -> None:
    waiting = RankTimes.from_rows([row(0.008, 0.004, 0.0), row(0.008, 0.004, 0.0)], ["a", "a"])
    assert waiting.data_bound() and waiting.data_share() == pytest.approx(8 / 13, rel=0.01)
    one = RankTimes.from_rows([row(0.008, 0.004, 0.0), row(0.0, 0.004, 0.008)], ["a", "a"])
    assert not one.data_bound()


def test_a_wait_shorter_than_a_loader_workers_hand_over_is_not_data_bound() -> None:
    # the toy stream of ~1 ms steps: 36% of the step, but workers would add more than it waits
    toy = RankTimes.from_rows([row(0.0007, 0.0008, 0.0, 0.0004)] * 2, ["a", "a"])
    assert toy.data_share() > 0.3 and not toy.data_bound()
    assert RankTimes.from_rows([row(0.005, 0.004, 0.0)] * 2, ["a", "a"]).data_bound()


def test_a_rank_with_far_more_memory_is_named() -> None:
    rows = [row(0.0, 0.01, 0.0, peak_mb=300), row(0.0, 0.01, 0.0, peak_mb=700)]
    assert RankTimes.from_rows(rows, ["a", "a"]).memory_outlier() == (
        "rank 1 peaks at 700 MB of memory, the median of the others 300 MB"
    )
    close = [row(0.0, 0.01, 0.0, peak_mb=300), row(0.0, 0.01, 0.0, peak_mb=400)]
    assert RankTimes.from_rows(close, ["a", "a"]).memory_outlier() is None


def test_the_figures_for_the_logs_add_up() -> None:
    rows = [row(0.001, 0.010, 0.004), row(0.002, 0.012, 0.001, peak_mb=350)]
    metrics = RankTimes.from_rows(rows, ["a", "a"]).metrics()
    phases = ("data", "compute", "sync", "optimizer", "other")
    assert sum(metrics[f"time/{p}_ms"] for p in phases) == pytest.approx(metrics["time/step_ms"])
    assert metrics["time/step_ms"] == pytest.approx(16.0)
    assert (metrics["time/work_ms_min"], metrics["time/work_ms_max"]) == pytest.approx((12, 15))
    assert (metrics["mem/peak_mb"], metrics["mem/peak_rank"]) == (350.0, 1.0)


def test_the_epoch_line_shows_the_breakdown_in_its_own_form() -> None:
    times = RankTimes.from_rows([row(0.001, 0.010, 0.004), row(0.001, 0.010, 0.004)], ["a"] * 2)
    metrics = {"epoch": 1.0, "loss": 0.5, "time_s": 2.0, **times.metrics()}
    assert format_epoch(metrics, 3, times) == (
        "epoch 1/3  loss 0.5000  (2.00 s; 16.0 ms/step: data 1.0, compute 10.0, sync 4.0, "
        "optimizer 1.0, other 0.0; peak memory 300 MB (rank 0))"
    )


class Loader:
    def __init__(self, **settings: Any) -> None:
        defaults = {"num_workers": 0, "pin_memory": False, "persistent_workers": False,
                    "prefetch_factor": None}  # fmt: skip
        self.__dict__.update({**defaults, **settings})


@pytest.mark.parametrize(
    ("settings", "cores", "cuda", "says"),
    [
        ({}, 8, False, "num_workers=7 (this machine has 8 cores per rank), with "
                       "persistent_workers=True"),
        ({}, 1, True, "1 core per rank, which they share with training), with "
                      "persistent_workers=True and pin_memory=True"),
        ({"num_workers": 2, "persistent_workers": True}, 8, False,
         "raise the loader's num_workers from 2 (this machine has 8 cores per rank)"),
        ({"num_workers": 4, "persistent_workers": True, "prefetch_factor": 2}, 4, False,
         "make each sample cheaper to load"),
    ],
)  # fmt: skip
def test_the_data_advice_fits_the_loader_and_the_cores(
    settings: dict[str, Any], cores: int, cuda: bool, says: str
) -> None:
    assert says in data_advice(LoaderFacts.of(Loader(**settings)), cores, cuda)


def test_a_loader_that_is_not_a_dataloader_gets_general_advice() -> None:
    assert "not a DataLoader" in data_advice(LoaderFacts.of([1, 2]), 4, False)


def test_the_cpu_peak_starts_again_each_epoch() -> None:
    cpu = torch.device("cpu")
    ballast = torch.ones(200 * MB // 4)  # touched: resident
    high = peak_memory_bytes(cpu)
    del ballast
    reset_peak_memory(cpu)
    assert peak_memory_bytes(cpu) < high - 100 * MB


def _vm_hwm_bytes() -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if "VmHWM" in x)
    return int(line.split()[1]) * 1024


def test_the_cpu_peak_is_the_kernels_vmhwm_and_falls_back_without_proc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu = torch.device("cpu")
    before = _vm_hwm_bytes()
    peak = peak_memory_bytes(cpu)
    assert before <= peak <= _vm_hwm_bytes()
    # Another system (no /proc): the peak since the process started, from getrusage.
    monkeypatch.setattr(memory, "_STATUS", "/nonexistent/status")
    assert peak_memory_bytes(cpu) >= peak - 64 * MB


def test_a_trained_epoch_carries_the_breakdown_to_its_line_and_its_logs(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    ddpkit.init()
    try:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.utils.data.TensorDataset(torch.ones(8, 4), torch.zeros(8, 1))
        loop = ddpkit.TrainLoop({"model": model, "optimizer": opt}, log_dir=tmp_path)
        with caplog.at_level(logging.INFO, logger="ddpkit"):
            for _ in loop.epochs(1):
                for x, y in loop.batches(ddpkit.prepare_loader(data, batch_size=2)):
                    loop.backward(torch.nn.functional.mse_loss(model(x), y))
                    loop.optimizer_step()
    finally:
        ddpkit.shutdown()
    epoch = loop.history[0]
    assert epoch["time/step_ms"] > 0 and epoch["mem/peak_mb"] > 10
    # One rank can be no straggler (its judging is tested below on several ranks' rows): what
    # one rank shows is the epoch line, once, with the breakdown and a peak naming no rank.
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch 1/1")]
    form = (r"\(\d+\.\d\d s; [\d.]+ ms/step: data [\d.]+, compute [\d.]+, sync [\d.]+, "
            r"optimizer [\d.]+, other [\d.]+; peak memory \d+ MB\)$")  # fmt: skip
    assert re.search(form, line), line
    with (tmp_path / "metrics.csv").open(newline="") as rows:
        logged = {row["tag"]: float(row["value"]) for row in csv.DictReader(rows)}
    for phase in ("data", "compute", "sync", "optimizer", "other"):
        assert logged[f"epoch/time/{phase}_ms"] == pytest.approx(epoch[f"time/{phase}_ms"])
    assert logged["epoch/mem/peak_mb"] == pytest.approx(epoch["mem/peak_mb"])


# What rank 0 says over a run's sharings: a RankReport fed each epoch's rows (as the
# all-gather would give them on rank 0), one judged epoch after another, without processes.

SLOW_S = 0.020  # a straggler's extra work per step: well past both thresholds
Said = Callable[[list[list[float]]], list[str]]  # one epoch's rows -> rank 0's warnings


def epoch_rows(slow: int | None = None, phase: Phase = Phase.COMPUTE, ranks: int = 3,
               peaks: dict[int, float] | None = None) -> list[list[float]]:  # fmt: skip
    """Every rank's row for one epoch: 12 ms of work per step, ``slow``'s 20 ms more in
    ``phase`` (the others wait for it in sync), ``peaks`` (MB) by rank."""
    rows = []
    for rank in range(ranks):
        peak = (peaks or {}).get(rank, 300.0)
        if rank != slow:
            rows.append(row(0.001, 0.010, SLOW_S, peak_mb=peak))
        elif phase is Phase.DATA:
            rows.append(row(0.001 + SLOW_S, 0.010, 0.0, peak_mb=peak))
        else:
            rows.append(row(0.001, 0.010 + SLOW_S, 0.0, peak_mb=peak))
    return rows


class Gathered:
    """``all_gather_same`` on rank 0 of a job of ``len(rows)`` ranks on one host: the times'
    rows the test sets (no rank asking for a profile), and this host's name from every rank."""

    def __init__(self) -> None:
        self.rows: list[list[float]] = []

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dtype == torch.uint8:  # the host names, shared once
            return tensor.unsqueeze(0).repeat(len(self.rows), 1)
        return torch.tensor([[*row, 0.0] for row in self.rows], dtype=torch.float64)


@pytest.fixture
def said(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Iterator[Said]:
    """``said(rows)``: one epoch's sharing of ``rows`` by one RankReport, and the warnings
    rank 0 gave for it. The first call is this process's first sharing (its warm-up)."""
    ddpkit.init()
    gathered = Gathered()
    monkeypatch.setattr(rankreport, "all_gather_same", gathered)
    monkeypatch.setattr(rankreport, "_warm", False)  # whatever other tests shared before
    report = RankReport(StepClock([], torch.device("cpu")))

    def share(rows: list[list[float]]) -> list[str]:
        gathered.rows = rows
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ddpkit"):
            report.epoch_end(LoaderFacts.of(Loader()))
        return [record.getMessage() for record in caplog.records]

    try:
        yield share
    finally:
        ddpkit.shutdown()


def named(warnings: list[str]) -> list[str]:
    """``rank 1 computing`` for each straggler line among ``warnings`` (a line of another
    form as it is)."""
    lines = [w for w in warnings if w.startswith("straggler")]
    form = r"straggler: (rank \d+) is \d+% slower .*?ms per step (\w+)"
    found = [re.match(form, line) for line in lines]
    return [f"{m[1]} {m[2]}" if m else line for line, m in zip(lines, found, strict=True)]


def test_a_straggler_is_named_once_over_judged_epochs_with_the_same_slow_rank(said: Said) -> None:
    epochs = [named(said(epoch_rows(slow=1))) for _ in range(5)]
    # The first sharing is the warm-up (not judged); then rank 1 once, not every epoch.
    assert epochs == [[], ["rank 1 computing"], [], [], []]


def test_a_straggler_is_named_again_when_the_slow_rank_changes(said: Said) -> None:
    said(epoch_rows())  # the warm-up
    epochs = [named(said(epoch_rows(slow=rank))) for rank in (1, 1, 2, 2, 1)]
    assert epochs == [["rank 1 computing"], [], ["rank 2 computing"], [], ["rank 1 computing"]]


def test_a_straggler_is_named_again_when_it_loses_its_time_in_another_phase(said: Said) -> None:
    said(epoch_rows())
    phases = (Phase.COMPUTE, Phase.COMPUTE, Phase.DATA, Phase.DATA)
    epochs = [named(said(epoch_rows(slow=1, phase=phase))) for phase in phases]
    assert epochs == [["rank 1 computing"], [], ["rank 1 waiting"], []]


def test_a_straggler_back_after_balanced_epochs_is_not_named_again(said: Said) -> None:
    # A rank near the threshold comes and goes by epoch: said when it first shows, not each
    # time it crosses back (what is said changes only with the rank or the phase).
    said(epoch_rows())
    epochs = [named(said(epoch_rows(slow=slow))) for slow in (1, None, 1, None, 1)]
    assert epochs == [["rank 1 computing"], [], [], [], []]


def test_balanced_ranks_within_the_measured_spread_are_never_named(said: Said) -> None:
    # Balanced 2-worker CPU runs differed by up to 35% in their quicker steps' work (see
    # ranktimes): judged epochs at that spread, either rank ahead, name no straggler.
    ahead = [row(0.0, 0.010, 0.0035, work=0.010), row(0.0, 0.0135, 0.0, work=0.0135)]
    epochs = [ahead, ahead[::-1], ahead, ahead[::-1], ahead]  # the first: the warm-up
    assert [named(said(rows)) for rows in epochs] == [[]] * 5
    assert named(said(epoch_rows(slow=1, ranks=2))) == ["rank 1 computing"]  # judged: it can


def test_data_bound_is_said_once_over_epochs(said: Said) -> None:
    waiting = [row(0.008, 0.004, 0.0), row(0.008, 0.004, 0.0)]
    epochs = [[w for w in said(waiting) if w.startswith("data-bound:")] for _ in range(3)]
    assert [len(lines) for lines in epochs] == [1, 0, 0]


def test_a_memory_outlier_is_said_once_per_rank_whatever_its_peak(said: Said) -> None:
    peaks = [{1: 700}, {1: 900}, {2: 700}, {1: 700}, {2: 1000}]  # MB, by rank
    epochs = [[w for w in said(epoch_rows(peaks=p)) if w.startswith("memory:")] for p in peaks]
    who = [[line.split(" peaks")[0] for line in lines] for lines in epochs]
    assert who == [["memory: rank 1"], [], ["memory: rank 2"], [], []]


def test_a_carried_row_comes_back_with_the_times_and_without_them() -> None:
    ddpkit.init()
    report = RankReport(StepClock([], torch.device("cpu")))
    carry = torch.tensor([2.0, 5.0], dtype=torch.float64)
    times, carried = report.share_carrying(LoaderFacts.of(Loader()), carry)
    report.clock.enabled = False  # the times off: the row still travels, alone
    no_times, alone = report.share_carrying(LoaderFacts.of(Loader()), carry)
    ddpkit.shutdown()
    assert times is not None and carried is not None and carried.tolist() == [[2.0, 5.0]]
    assert no_times is None and alone is not None and alone.tolist() == [[2.0, 5.0]]


class _Stderr(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


@pytest.mark.parametrize(("terminal", "live", "drawn"), [
    (False, None, False),  # CI logs, pipes: tqdm would hide it; none is built
    (True, None, True),
    (False, "1", True),  # under ddpkit run, whose own console is a terminal
])  # fmt: skip
def test_the_bar_is_built_only_where_it_shows(
    monkeypatch: pytest.MonkeyPatch, terminal: bool, live: str | None, drawn: bool
) -> None:
    stderr = _Stderr(terminal)
    monkeypatch.setattr(sys, "stderr", stderr)
    if live is None:
        monkeypatch.delenv(LIVE_CONSOLE_ENV, raising=False)
    else:
        monkeypatch.setenv(LIVE_CONSOLE_ENV, live)
    console = Console(log_every=None)
    console.epoch_started(0, 2, total=4, done=0)
    console.batch_done()
    console.step_done(lambda: "epoch 1/2  batch 1/4", {"loss": 0.5})
    assert (console.bar is not None) is drawn
    console.epoch_done({"epoch": 1.0, "loss": 0.5}, 2)
    assert ("epoch 1/2" in stderr.getvalue()) is drawn


def test_the_bar_counts_every_batch_once_whether_it_ended_a_step_or_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Accumulating over 2 batches: the first of each group is counted by batch_done, the
    one that steps by step_done (one call a batch on the loop's path, not two)."""
    monkeypatch.setattr(sys, "stderr", _Stderr(True))
    monkeypatch.delenv(LIVE_CONSOLE_ENV, raising=False)
    console = Console(log_every=None)
    console.epoch_started(0, 1, total=4, done=0)
    for _group in range(2):
        console.batch_done()
        console.step_done(lambda: "epoch 1/1", {"loss": 0.5})
    assert console.bar is not None and console.bar.n == 4
    console.epoch_done({"epoch": 1.0, "loss": 0.5}, 1)


def test_a_straggler_on_a_host_with_more_cpu_ranks_than_cores_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """32 CPU ranks on 2 cores take turns on them: a rank named slower may be only that, and
    the line says so; on a GPU, or with a core each, it says nothing more."""
    from ddpkit.env.world import World

    ddpkit.init()
    report = RankReport(StepClock([], torch.device("cpu")))
    ddpkit.shutdown()
    monkeypatch.setattr(rankreport, "launch_cores", lambda: 2)
    report.world = World(rank=0, local_rank=0, world_size=32, local_world_size=32)
    assert report._oversubscribed() == (
        "; but this host runs 32 CPU ranks on 2 cores, which they take turns on: a rank can "
        "lag by that alone"
    )
    report.world = World(rank=0, local_rank=0, world_size=2, local_world_size=2)
    assert report._oversubscribed() == ""


class FakeTime:
    """time.monotonic as a test moves it: ``step_s`` a step."""

    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 1000.0, step_s

    def monotonic(self) -> float:
        return self.now


def shared_at(log_every: int | None, step_s: float, steps: int,
              monkeypatch: pytest.MonkeyPatch) -> list[int]:  # fmt: skip
    """The steps at which a run's observer shared the ranks' times (a world of one)."""
    from ddpkit.observe import observer

    fake = FakeTime(step_s)
    monkeypatch.setattr(observer, "time", fake)
    ddpkit.init()
    try:
        watched = observer.RunObserver([torch.nn.Linear(2, 1)], torch.device("cpu"), log_every)
        shares: list[int] = []
        real = watched.ranks.share_carrying

        def counted(*args: Any, **kwargs: Any) -> Any:
            shares.append(step)
            return real(*args, **kwargs)

        monkeypatch.setattr(watched.ranks, "share_carrying", counted)
        for step in range(1, steps + 1):
            fake.now += step_s
            watched.step_done(step, True, None, lambda: "", {})
        return shares
    finally:
        ddpkit.shutdown()


def test_the_times_are_shared_after_50_steps_then_about_every_10_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 20 ms steps: the first sharing at step 50, then one each 500 steps (10 s at that pace);
    # every 50 steps cost 0.5% of a 15 ms GPT-2 step here (each sharing 2-4 ms on gloo)
    assert shared_at(None, 0.02, 1100, monkeypatch) == [50, 550, 1050]
    # 2 s steps: every 5 steps after the first 50, not every 50 (100 s apart)
    assert shared_at(None, 2.0, 65, monkeypatch) == [50, 55, 60, 65]


def test_log_every_shares_at_its_own_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    assert shared_at(7, 0.02, 30, monkeypatch) == [7, 14, 21, 28]
