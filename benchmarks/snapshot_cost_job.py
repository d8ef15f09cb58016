"""examples/gpt.py's training, unchanged but for a callback that keeps memory snapshots on in
some epochs and off in others (benchmarks/snapshot_cost.py --within): after the first epoch
(warm-up), pairs of epochs in A-B, B-A order, so that a drift of the machine's speed falls on
both alike. Each epoch's start says which: ``snapshots on for epoch N`` / ``off``; the end
says how long rank 0's snapshots took: ``snapshot: median X ms a step``.

    ddpkit run --nproc 2 --max-restarts 1 benchmarks/snapshot_cost_job.py --epochs 11

With ``SNAPSHOT_COST_STEPS=1`` (benchmarks/snapshot_cost.py --steps) the snapshots alternate
step by step instead, from the second epoch: each step's time, from one step's end to the
next's, is counted as with or without by whether the step before it kept its snapshot (its
copying comes after the step's hooks). Each epoch says ``steps with X ms, without Y ms``
(medians): a drift of the machine falls on both within a few milliseconds.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import ddpkit
import gpt


def snapshots_on(epoch: int) -> bool:
    """Epoch 1 (warm-up) on; then A-B, B-A, A-B, ... pairs."""
    if epoch == 1:
        return True
    pair, second = divmod(epoch - 2, 2)
    return bool(second) == bool(pair % 2)


class AlternateSnapshots(ddpkit.Callback):
    """Takes the loop's snapshots away for the epochs :func:`snapshots_on` says off."""

    def __init__(self) -> None:
        self.kept: Any = None
        self.seconds: list[float] = []  # each snapshot's, on this rank

    def on_train_epoch_start(self, trainer: ddpkit.Trainer, epoch: int) -> None:
        loop = trainer.loop
        if self.kept is None:
            self.kept = loop.snapshots
            if self.kept is None:
                raise SystemExit("no memory snapshots: run under ddpkit run --max-restarts 1")
            self.kept.take = self._timed(self.kept.take)
        on = snapshots_on(epoch)
        loop.snapshots = self.kept if on else None
        ddpkit.print0(f"snapshots {'on' if on else 'off'} for epoch {epoch}")

    def on_fit_end(self, trainer: ddpkit.Trainer) -> None:
        median = statistics.median(self.seconds) * 1e3
        ddpkit.print0(f"snapshot: median {median:.3f} ms a step ({len(self.seconds)} taken)")

    def _timed(self, take: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> None:
            started = time.perf_counter()
            take(*args, **kwargs)
            self.seconds.append(time.perf_counter() - started)

        return timed


class InterleavedSnapshots(ddpkit.Callback):
    """Snapshots on at every other step (which ones swaps each epoch), each step timed."""

    def __init__(self) -> None:
        self.kept: Any = None
        self.last: float | None = None
        self.previous_on = False
        self.times: dict[bool, list[float]] = {True: [], False: []}

    def on_train_epoch_start(self, trainer: ddpkit.Trainer, epoch: int) -> None:
        if self.kept is None:
            self.kept = trainer.loop.snapshots
            if self.kept is None:
                raise SystemExit("no memory snapshots: run under ddpkit run --max-restarts 1")
        self.last, self.times = None, {True: [], False: []}  # an epoch's start is not a step

    def on_train_batch_end(self, trainer: ddpkit.Trainer, batch: Any, metrics: Any) -> None:
        now, loop = time.perf_counter(), trainer.loop
        if self.last is not None:
            self.times[self.previous_on].append(now - self.last)
        self.last = now
        warm_up = loop.epoch == 0
        self.previous_on = warm_up or (loop.step % 2 == loop.epoch % 2)
        loop.snapshots = self.kept if self.previous_on else None  # taken after this hook

    def on_train_epoch_end(self, trainer: ddpkit.Trainer, metrics: Any) -> None:
        trainer.loop.snapshots = self.kept  # the epoch's end keeps one either way
        with_, without = self.times[True], self.times[False]
        if trainer.loop.epoch > 1 and with_ and without:
            ddpkit.print0(f"epoch {trainer.loop.epoch}: steps with "
                          f"{statistics.median(with_) * 1e3:.3f} ms, without "
                          f"{statistics.median(without) * 1e3:.3f} ms "
                          f"({len(with_)} and {len(without)} steps)")  # fmt: skip


def main() -> None:
    original = gpt.LMTrainer.__init__

    def with_alternation(self: Any, *args: Any, callbacks: Any = (), **kwargs: Any) -> None:
        mine = InterleavedSnapshots() if os.environ.get("SNAPSHOT_COST_STEPS") else (
            AlternateSnapshots())  # fmt: skip
        original(self, *args, callbacks=[*callbacks, mine], **kwargs)

    gpt.LMTrainer.__init__ = with_alternation
    gpt.main()


if __name__ == "__main__":
    main()
