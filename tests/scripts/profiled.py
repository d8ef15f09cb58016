"""A 2-worker job for the profiling tests (run with ddpkit run); rank 1 is slow on purpose.

    profiled.py OUT STEPS SLOW_MS [--skew-ms MS] [--log-every N]

Rank 1 sleeps SLOW_MS in its model's forward (Python, in no torch operator); with --skew-ms
its wall clock (and so its trace) runs MS ahead of rank 0's (DDPKIT_TEST_CLOCK_SKEW_MS).
Every rank sleeps 5 ms a step, so a job of many steps runs long enough to be asked for a
profile while it runs: rank 0 writes OUT/running at step 10 and the test then drops the
request file. A hand-written loop (TrainLoop), STEPS optimizer steps in one epoch.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import ddpkit


class SlowOnRank1(nn.Module):
    def __init__(self, slow_s: float) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
        self.slow_s = slow_s if ddpkit.current_world().rank == 1 else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.005 + self.slow_s)
        return self.body(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("steps", type=int)
    parser.add_argument("slow_ms", type=float)
    parser.add_argument("--skew-ms", type=float, default=0.0)
    parser.add_argument("--log-every", type=int, default=None)
    args = parser.parse_args()
    world = ddpkit.init()
    if world.rank == 1 and args.skew_ms:
        os.environ["DDPKIT_TEST_CLOCK_SKEW_MS"] = str(args.skew_ms)
    torch.manual_seed(0)
    model = ddpkit.prepare_model(SlowOnRank1(args.slow_ms / 1000))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    samples = args.steps * 16 * world.world_size
    data = torch.utils.data.TensorDataset(torch.randn(samples, 32), torch.randint(0, 4, (samples,)))
    loader = ddpkit.prepare_loader(data, batch_size=16)
    loop = ddpkit.TrainLoop({"model": model, "optimizer": optimizer}, log_every=args.log_every)
    for _ in loop.epochs(1):
        for x, y in loop.batches(loader):
            loop.backward(F.cross_entropy(model(x), y))
            loop.optimizer_step(optimizer)
            if loop.step == 10 and world.rank == 0:
                (args.out / "running").write_text("step 10")


if __name__ == "__main__":
    main()
