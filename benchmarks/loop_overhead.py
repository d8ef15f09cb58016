"""What the training loop itself costs per step: a tiny model, so the loop's own work shows.

The parity benchmark times realistic steps (tens of milliseconds), where the loop's cost is
far below this machine's noise between runs. Here one process trains a 32x4 linear model on
batches of 16 (a step of a few hundred microseconds) three ways, alternating, in one run:

- ``plain``: the tutorials' loop: ``for x, y in loader``, forward, ``loss.backward()``,
  ``opt.step()``, ``opt.zero_grad()``;
- ``trainer``: ``ddpkit.Trainer.fit`` with the default step;
- ``loop``: the same loop through ``ddpkit.TrainLoop`` (``backward``, ``optimizer_step``).

It prints each one's fastest epoch in microseconds per step and its extra cost over plain.

    .venv/bin/python benchmarks/loop_overhead.py            # ~1 minute
    .venv/bin/python benchmarks/loop_overhead.py --rounds 2 --samples 512   # smoke
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import ddpkit


def plain(model: torch.nn.Module, opt: torch.optim.Optimizer, loader: object) -> None:
    for x, y in loader:  # type: ignore[attr-defined]
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def trainer(model: torch.nn.Module, opt: torch.optim.Optimizer, loader: object) -> None:
    ddpkit.Trainer(model, opt, F.cross_entropy).fit(loader, epochs=1)  # type: ignore[arg-type]


def loop(model: torch.nn.Module, opt: torch.optim.Optimizer, loader: object) -> None:
    run = ddpkit.TrainLoop({"model": model, "optimizer": opt})
    for _epoch in run.epochs(1):
        for x, y in run.batches(loader):  # type: ignore[arg-type]
            run.backward(F.cross_entropy(model(x), y))
            run.optimizer_step(opt)


WAYS: dict[str, Callable[..., None]] = {"plain": plain, "trainer": trainer, "loop": loop}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="epochs of each way, alternating")
    parser.add_argument("--samples", type=int, default=4096)
    args = parser.parse_args()
    ddpkit.init(hang_timeout=0)
    logging.getLogger("ddpkit").setLevel(logging.WARNING)  # the epoch lines, not timed output
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 32), torch.randint(0, 4, (args.samples,)))
    model = ddpkit.prepare_model(torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = ddpkit.prepare_loader(data, batch_size=16)
    fastest = dict.fromkeys(WAYS, float("inf"))
    for round_ in range(args.rounds + 1):
        for name, way in WAYS.items():
            start = time.perf_counter()
            way(model, opt, loader)
            seconds = (time.perf_counter() - start) / len(loader)
            if round_ > 0:  # the first round warms up
                fastest[name] = min(fastest[name], seconds)
    print(f"\nfastest of {args.rounds} epochs of {len(loader)} steps, 1 process, 1 thread:")
    for name, seconds in fastest.items():
        extra = (seconds - fastest["plain"]) * 1e6
        print(f"  {name:8} {seconds * 1e6:7.1f} us/step  (+{extra:.1f} us over plain)")
    ddpkit.shutdown()


if __name__ == "__main__":
    main()
