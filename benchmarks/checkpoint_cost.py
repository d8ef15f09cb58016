"""What checkpoints cost: a 25M-parameter model with Adam state (about 286 MB).

Files: saves and loads the same state as plain ``torch.save`` / ``torch.load(weights_only=
True)`` (written atomically alike) and as ddpkit's sealed checkpoint (SHA-256 of the
contents, checked on load), alternately, and prints the median of each and the digest's own
speed.

Training (``--training``): the Trainer trains that model (25 linear layers of 1000x1000, Adam)
in this process with a checkpoint every 5 steps, epochs alternating between synchronous
saves and ``async_save=True``, and prints the time the training loop stood still per save
(fastest and median; async: the copy, plus any wait for the previous write), their ratio,
and the step time of the steps a background write overlapped against the steps it did not.

    .venv/bin/python benchmarks/checkpoint_cost.py --rounds 3
    .venv/bin/python benchmarks/checkpoint_cost.py --training --rounds 3
    .venv/bin/python benchmarks/checkpoint_cost.py --training --rounds 3 --threads 1
    .venv/bin/python benchmarks/checkpoint_cost.py --training --folder s3://bucket/bench

``--every N`` saves every N steps (default 5). ``--folder`` puts the training's checkpoints
there instead of a temporary folder: another disk, or an object store (``s3://...``; with an
S3-compatible server of your own, set ``AWS_ENDPOINT_URL`` and the credentials; each run
writes under a prefix of its own).

With every core training (the default on a CPU-only machine), the background write competes
with the steps for the cores; ``--threads 1`` on 2 cores leaves one to the writer, as training
on a GPU leaves the host's cores.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ddpkit._core.atomicfile import atomic_write
from ddpkit.checkpoint import load_checkpoint, save_checkpoint
from ddpkit.checkpoint.integrity import content_digest
from ddpkit.runtime.callbacks import Callback


def model_and_adam_state(layers: int = 25) -> dict[str, Any]:
    torch.manual_seed(0)
    weights = {f"layer{i}.weight": torch.randn(1000, 1000) for i in range(layers)}
    moments = {i: {"exp_avg": torch.randn(1000, 1000), "exp_avg_sq": torch.randn(1000, 1000)}
               for i in range(layers)}  # fmt: skip
    return {"model": weights, "optimizer": {"state": moments}}


def timed(action: Callable[[], Any]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


class SaveClock:
    """Times each save on the training path and each step, noting whether a write ran."""

    def __init__(self, trainer: Any) -> None:
        self.stalls: list[float] = []
        self.steps: list[tuple[float, bool]] = []  # (seconds, a background write overlapped)
        checkpointer = trainer.loop.checkpointer
        self.writer, save = checkpointer.writer, checkpointer.save
        self._last = time.perf_counter()

        def timed_save(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            path = save(*args, **kwargs)
            self.stalls.append(time.perf_counter() - start)
            self._last = time.perf_counter()  # the step after starts now
            return path

        checkpointer.save = timed_save

    def step_ended(self) -> None:
        now = time.perf_counter()
        overlapped = self.writer is not None and self.writer.busy
        self.steps.append((now - self._last, overlapped))
        self._last = now


class Steps(Callback):
    """A callback that tells the clock each step's end (made before the Trainer it serves)."""

    clock: SaveClock | None = None

    def on_train_batch_end(self, trainer: Any, batch: Any, metrics: Any) -> None:
        if self.clock is not None:
            self.clock.step_ended()


def train_epochs(layers: int, rounds: int, folder: str, every: int) -> dict[str, SaveClock]:
    import ddpkit

    ddpkit.init(hang_timeout=0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1000, 1000, bias=False) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    samples = 32 * 4 * max(every, 5)  # four saves a run
    data = torch.utils.data.TensorDataset(torch.randn(samples, 1000), torch.randn(samples, 1000))
    loader = ddpkit.prepare_loader(data, batch_size=32)
    clocks: dict[str, list[SaveClock]] = {"sync": [], "async": []}
    for index in range(2 * rounds):
        setting = "async" if index % 2 else "sync"
        steps = Steps()
        run = f"{folder}/{time.strftime('%H%M%S')}-{index}"  # every run from scratch
        trainer = ddpkit.Trainer(model, opt, torch.nn.functional.mse_loss, run,
                                 save_every_steps=every, keep_last=2, callbacks=[steps],
                                 async_save=setting == "async")  # fmt: skip
        steps.clock = SaveClock(trainer)
        trainer.fit(loader, epochs=1)
        clocks[setting].append(steps.clock)
    ddpkit.shutdown()
    merged = {}
    for setting, runs in clocks.items():
        merged[setting] = runs[0]
        for run in runs[1:]:
            merged[setting].stalls += run.stalls
            merged[setting].steps += run.steps
    return merged


def report_training(clocks: dict[str, SaveClock], megabytes: float, every: int) -> None:
    stall = {s: (min(c.stalls), statistics.median(c.stalls)) for s, c in clocks.items()}
    print(f"training with a {megabytes:.0f} MB checkpoint every {every} steps, stall per save:")
    for setting, (fastest, median) in stall.items():
        print(f"  {setting:5s} fastest {fastest:6.3f} s  median {median:6.3f} s  "
              f"({len(clocks[setting].stalls)} saves)")  # fmt: skip
    print(f"ratio async/sync: fastest {stall['async'][0] / stall['sync'][0]:.3f}  "
          f"median {stall['async'][1] / stall['sync'][1]:.3f}")  # fmt: skip
    plain = [t for t, _ in clocks["sync"].steps]
    overlapped = [t for t, busy in clocks["async"].steps if busy]
    alone = [t for t, busy in clocks["async"].steps if not busy]
    print(f"step time: sync run {statistics.median(plain):.3f} s; async run "
          f"{statistics.median(alone):.3f} s without a write in flight, "
          f"{statistics.median(overlapped or [float('nan')]):.3f} s with one "
          f"({len(overlapped)} steps)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=25, help="1000x1000 layers (1M each)")
    parser.add_argument("--training", action="store_true", help="the stall per save instead")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for training (default: every core)")  # fmt: skip
    parser.add_argument("--every", type=int, default=5, help="steps between checkpoints")
    parser.add_argument("--folder", default=None,
                        help="where the training's checkpoints go: a path or s3://...")  # fmt: skip
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    megabytes = 3 * args.layers * 1000 * 1000 * 4 / 2**20
    if args.training:
        folder = Path(tempfile.mkdtemp(prefix="ddpkit-ckpt-", dir=Path.cwd()))
        try:
            clocks = train_epochs(args.layers, args.rounds, args.folder or str(folder), args.every)
            report_training(clocks, megabytes, args.every)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    state = model_and_adam_state(args.layers)
    folder = Path(tempfile.mkdtemp(prefix="ddpkit-ckpt-", dir=Path.cwd()))
    plain, sealed = folder / "plain.pt", folder / "epoch_000001.pt"
    actions = {
        "digest only": lambda: content_digest(state),
        "plain save": lambda: atomic_write(plain, lambda handle: torch.save(state, handle)),
        "sealed save": lambda: save_checkpoint(state, folder, epoch=1),
        "plain load": lambda: torch.load(plain, weights_only=True),
        "checked load": lambda: load_checkpoint(sealed),
    }
    times: dict[str, list[float]] = {name: [] for name in actions}
    try:
        for _ in range(args.rounds):
            for name, action in actions.items():
                times[name].append(timed(action))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{megabytes:.0f} MB of tensors, median of {args.rounds} rounds:")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:13s} {median:6.2f} s  ({megabytes / median:5.0f} MB/s)")


if __name__ == "__main__":
    main()
