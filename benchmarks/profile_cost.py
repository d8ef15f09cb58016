"""What profiling costs: nothing while it is off, and this much in a profiled window.

Each of 2 workers trains the parity benchmark's model (benchmarks/parity.py) epoch after
epoch, in turn in three settings, each epoch a fresh Trainer:

- ``absent``: the observer's profiler replaced by one that does nothing, and no clock tap
  (what the loop cost before profiling existed);
- ``off``: ddpkit as shipped, with no window asked for (the profiler is told every step and
  looks for a request file whenever the ranks share their times);
- ``profiled``: the whole epoch is one profiled window (torch.profiler on both ranks, the
  phase tap); the time its end takes (traces written, sent and merged) is shown apart.

Prints the fastest and median epoch's step time of each (the first epoch warms up), the
ratios off/absent and profiled/absent, and how long writing a window took on rank 0.

    .venv/bin/python benchmarks/profile_cost.py                 # 40 epochs of 16 steps each
    .venv/bin/python benchmarks/profile_cost.py --workload cnn --rounds 10 --samples 4096

Many short epochs: this machine's noise moves a whole epoch by 5-10%, so only the fastest of
many tells settings 1% apart.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from parity import make_data, make_model

import ddpkit
from ddpkit.observe.profiling.profiler import RankProfiler
from ddpkit.observe.steptime import Phase, StepClock

SETTINGS = ("absent", "off", "profiled")


class Absent:
    """A profiler that is told nothing and does nothing."""

    active = False

    def step_done(self, *_: Any, **__: Any) -> None: ...
    def asked(self) -> bool:
        return False

    def requested(self, *_: Any) -> None: ...
    def close(self) -> None: ...


def one_epoch(
    model: Any, optimizer: Any, loader: Any, setting: str, folder: Path
) -> tuple[float, float]:
    """Seconds per step of one epoch in ``setting`` (less the window's writing), and the
    seconds the window took to write (0 without one)."""
    profile = f"1-{len(loader)}" if setting == "profiled" else None
    trainer = ddpkit.Trainer(model, optimizer, F.cross_entropy, profile=profile)
    observer = trainer.loop.observer
    observer.profiler.folder = folder / setting
    if setting == "absent":
        observer.profiler = Absent()  # type: ignore[assignment]
    epoch_s = trainer.fit(loader, epochs=1)[0]["time_s"]
    writing = getattr(observer.profiler, "writing_s", 0.0)
    return (epoch_s - writing) / len(loader), writing


def alternate(workload: str, rounds: int, samples: int) -> dict[str, list[float]]:
    """One worker: epochs in each setting in turn; seconds per step (and writing seconds)."""
    ddpkit.init(hang_timeout=0)
    torch.set_num_threads(1)
    model = ddpkit.prepare_model(make_model(workload))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = ddpkit.prepare_loader(make_data(workload, samples), 64)
    times: dict[str, list[float]] = {setting: [] for setting in (*SETTINGS, "writing")}
    with tempfile.TemporaryDirectory(prefix="ddpkit-profile-cost-") as folder:
        for index in range(len(SETTINGS) * rounds + 1):
            setting = SETTINGS[index % len(SETTINGS)]
            seconds, after = one_epoch(model, optimizer, loader, setting, Path(folder))
            if index > 0:  # the first epoch warms up
                times[setting].append(seconds)
                if setting == "profiled":
                    times["writing"].append(after)
    return times


def off_path_us(calls: int = 20_000) -> tuple[float, float]:
    """Microseconds that profiling costs while off, timed alone in this process: per step,
    the observer's call and the clock's check for a tap at each of its 5 phase moves; per
    look for the request file (once per 50 steps in a run)."""
    ddpkit.init(hang_timeout=0)
    clock = StepClock([], torch.device("cpu"))
    with tempfile.TemporaryDirectory() as folder:
        profiler = RankProfiler(None, clock, Path(folder))
        per_step = _seconds(
            calls, lambda step: (profiler.step_done(step, None, True), _moves(clock))
        )
        clock_only = _seconds(calls, lambda _: _moves(clock))
        look = _seconds(calls, lambda _: profiler.asked())
    ddpkit.shutdown()
    return (per_step - clock_only) / calls * 1e6, look / calls * 1e6


def _moves(clock: StepClock) -> None:
    for _ in range(5):
        clock.enter(Phase.COMPUTE)


def _seconds(calls: int, call: Any, repeats: int = 5) -> float:
    """The quickest of ``repeats`` runs of ``calls`` calls (noise only ever adds time)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for step in range(calls):
            call(step)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="epochs per setting")
    parser.add_argument("--workload", default="mlp", choices=["mlp", "cnn"])
    parser.add_argument("--samples", type=int, default=2048, help="per epoch, all workers")
    args = parser.parse_args()
    step_us, look_us = off_path_us()
    print(f"profiling off, timed alone: {step_us:.2f} us per step, {look_us:.2f} us per look "
          "for the request file (every 50 steps)")  # fmt: skip
    times = ddpkit.spawn(alternate, 2, args.workload, args.rounds, args.samples)[0]
    steps = args.samples // 2 // 64
    print(
        f"\n{args.workload}, 2 workers, {steps} steps per epoch, {args.rounds} epochs per setting:"
    )
    for setting in SETTINGS:
        print(f"  {setting:9} fastest {min(times[setting]) * 1e3:.3f} ms/step  "
              f"median {statistics.median(times[setting]) * 1e3:.3f} ms/step")  # fmt: skip
    for setting in ("off", "profiled"):
        fastest = min(times[setting]) / min(times["absent"])
        median = statistics.median(times[setting]) / statistics.median(times["absent"])
        print(f"ratio {setting}/absent: fastest {fastest:.3f}  median {median:.3f}")
    print(f"writing a window of {steps} steps (stop, traces written, sent, merged; rank 0): "
          f"median {statistics.median(times['writing']):.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
