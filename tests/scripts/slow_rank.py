"""Runs whose ranks are slow in known ways, for the step-time reports (run with ddpkit run).

    slow_rank.py sleep     rank 1 sleeps 40 ms in every step (Trainer) and holds 400 MB more
    slow_rank.py sleep OUT S R   rank R sleeps S seconds a step instead (the scale tier's)
    slow_rank.py taskset   rank 1 shares its core with two busy loops (TrainLoop, 4 epochs)
    slow_rank.py data      every sample takes 5 ms to load, num_workers=0 (TrainLoop)
    slow_rank.py balanced  10 runs of a balanced job, each rank on a core of its own (Trainer)

Each run's epoch history goes to <out>/history-<case>.json (rank 0).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

import ddpkit

STEPS = 24  # per epoch
BATCH = 512


class Samples(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, count: int, load_s: float = 0.0) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(count, 64, generator=generator)
        self.y = torch.randint(0, 4, (count,), generator=generator)
        self.load_s = load_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.load_s:
            time.sleep(self.load_s)
        return self.x[index], self.y[index]


class WholeBatches(Samples):
    """The samples a batch at a time, by one indexing and no collation: loading then costs
    next to nothing, and what a slowed rank loses is lost computing."""

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = torch.tensor(indices)
        return self.x[chosen], self.y[chosen]


def as_fetched(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return batch


def model(width: int = 256) -> nn.Module:
    torch.manual_seed(0)
    # Compute-heavy, communication-light (83k parameters, batches of 512): on CPU the gradient
    # all-reduce's threads share the cores with the other rank's compute, which makes a rank
    # slower for an epoch on a machine with one core per rank (see docs/slow-jobs.md).
    layers = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                           nn.Linear(width, 4))  # fmt: skip
    return ddpkit.prepare_model(layers)


def loader(load_s: float = 0.0, batch: int = BATCH) -> torch.utils.data.DataLoader[object]:
    world = ddpkit.current_world()
    data = Samples(STEPS * batch * world.world_size, load_s)
    return ddpkit.prepare_loader(data, batch_size=batch)


def whole_batches() -> torch.utils.data.DataLoader[object]:
    data = WholeBatches(STEPS * BATCH * ddpkit.current_world().world_size)
    return ddpkit.prepare_loader(data, batch_size=BATCH, collate_fn=as_fetched)


def trainer_run(sleep_on_rank1: float = 0.0, slow: int = 1) -> list[dict[str, float]]:
    net = model()
    rank = ddpkit.current_world().rank

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if rank == slow and sleep_on_rank1:
            time.sleep(sleep_on_rank1)
        x, y = batch
        return nn.functional.cross_entropy(net(x), y)

    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    return ddpkit.Trainer(net, opt, training_step=step).fit(loader(), epochs=2)


def loop_run(
    net: nn.Module, train: torch.utils.data.DataLoader[object], epochs: int = 2
) -> list[dict[str, float]]:
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loop = ddpkit.TrainLoop({"model": net, "optimizer": opt})
    for _epoch in loop.epochs(epochs):
        for x, y in loop.batches(train):
            loop.backward(nn.functional.cross_entropy(net(x), y))
            loop.optimizer_step()
    return loop.history


def core_of_its_own() -> None:
    """Each rank on a core of its own, as each has a GPU of its own: the system does not
    move two ranks onto one core for a while (which makes one slower for that while)."""
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[ddpkit.current_world().rank % len(cores)]})


def busy_core_for_rank1() -> list[subprocess.Popen[bytes]]:
    """Rank 0 on core 0; rank 1 and two busy loops on core 1 (rank 1 gets about a third of
    it: with one loop, half, it was 56-70% slower, too near the 50% threshold to be named
    every time on a busy machine)."""
    rank = ddpkit.current_world().rank
    cores = sorted(os.sched_getaffinity(0))
    core_of_its_own()
    if rank != 1:
        return []
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    for hog in hogs:
        os.sched_setaffinity(hog.pid, {cores[1 % len(cores)]})
    return hogs


@contextlib.contextmanager
def no_garbage_collection() -> Iterator[None]:
    """No garbage collection while it runs: a full collection pauses the process for 70 to
    200 ms (on the shared core) in the phase that makes the most objects, loading (one or
    two per sample). One such pause in an epoch outweighed rank 1's extra compute and named
    the shared core "waiting for data"; the case measures the core, not the collector."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def shared_core_run() -> list[dict[str, float]]:
    """Rank 1 on a core shared with busy loops, for 4 epochs (the loops' share varies by
    epoch), doing little but computing, the phase its report must name: twice the width
    (3.5 times the compute; at 256, rank 1 was but 33-56% slower in one job), whole batches,
    no garbage collection."""
    hogs = busy_core_for_rank1()
    try:
        with no_garbage_collection():
            return loop_run(model(width=512), whole_batches(), epochs=4)
    finally:
        for hog in hogs:
            hog.kill()


def main() -> None:
    case, out = sys.argv[1], Path(sys.argv[2])
    ddpkit.init(seed=0)
    rank = ddpkit.current_world().rank
    histories = []
    if case == "sleep":
        seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 0.04
        slow = int(sys.argv[4]) if len(sys.argv) > 4 else 1
        ballast = torch.ones(400 * 2**20 // 4) if rank == slow else None  # 400 MB, touched
        histories.append(trainer_run(sleep_on_rank1=seconds, slow=slow))
        del ballast
    elif case == "taskset":
        histories.append(shared_core_run())
    elif case == "data":
        histories.append(loop_run(model(), loader(load_s=0.005, batch=16)))  # 80 ms/step loading
    else:
        core_of_its_own()
        histories += [trainer_run() for _ in range(10)]
    if rank == 0:
        (out / f"history-{case}.json").write_text(json.dumps(histories))
    ddpkit.shutdown()


if __name__ == "__main__":
    main()
