"""examples/gpt.py's training, unchanged but for a callback that keeps memory snapshots on in
some epochs and off in others (benchmarks/snapshot_cost.py --within): after the first epoch
(warm-up), pairs of epochs in A-B, B-A order, so that a drift of the machine's speed falls on
both alike. Each epoch's start says which: ``snapshots on for epoch N`` / ``off``; the end
says how long rank 0's snapshots took: ``snapshot: median X ms a step``.

    ddpkit run --nproc 2 --max-restarts 1 benchmarks/snapshot_cost_job.py --epochs 11
"""

from __future__ import annotations

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


def main() -> None:
    original = gpt.LMTrainer.__init__

    def with_alternation(self: Any, *args: Any, callbacks: Any = (), **kwargs: Any) -> None:
        original(self, *args, callbacks=[*callbacks, AlternateSnapshots()], **kwargs)

    gpt.LMTrainer.__init__ = with_alternation
    gpt.main()


if __name__ == "__main__":
    main()
