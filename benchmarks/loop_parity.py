"""TrainLoop against the hand-written DDP loop, in the same workers, epoch after epoch.

``parity.py`` launches each variant afresh, and on this shared 2-core machine one launch
differs from the next by several percent (the same loop, launched twice, has read 0.95 and
1.05): far more than a loop's own cost. Here 2 workers train the parity workload's DDP model
both ways in turn, alternating which goes first each round:

- ``hand``: the tutorials' loop: a ``DataLoader`` over a ``DistributedSampler``,
  ``zero_grad``, forward, ``loss.backward()``, ``optimizer.step()``;
- ``loop``: ``ddpkit.TrainLoop`` over ``prepare_loader``'s loader (``backward``,
  ``optimizer_step``): one loop for the run, as a script has, ``hand``'s epoch run inside
  each of its epochs.

Each way's batches are timed, and the loop's time also counts its epoch's end (its epoch
line: the metrics and the ranks' step times gathered, outside the batches). It prints, per
workload, the median of the rounds' paired ratios (loop / hand), each one's median step
time, and the fastest of each.
``--same`` runs the hand-written loop both ways: how far the ratio strays when nothing
differs, on this machine, that day.

    .venv/bin/python benchmarks/loop_parity.py --rounds 8      # about 2 minutes
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F
from parity import make_data, make_model, plain_step
from torch.utils.data import DataLoader, DistributedSampler

import ddpkit


def hand_epoch(model: Any, optimizer: Any, loader: DataLoader, epoch: int) -> float:
    loader.sampler.set_epoch(epoch)  # type: ignore[union-attr]
    step = plain_step(model, optimizer)
    start = time.perf_counter()
    for inputs, targets in loader:
        step(inputs, targets)
    return (time.perf_counter() - start) / len(loader)


def loop_batches(loop: Any, model: Any, optimizer: Any, loader: DataLoader) -> float:
    start = time.perf_counter()
    for inputs, targets in loop.batches(loader):
        loop.backward(F.cross_entropy(model(inputs), targets))
        loop.optimizer_step(optimizer)
    return (time.perf_counter() - start) / len(loader)


def worker(cfg: dict[str, Any]) -> dict[str, list[float]]:
    torch.set_num_threads(cfg["threads"])
    ddpkit.init()
    model = ddpkit.prepare_model(make_model(cfg["workload"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = make_data(cfg["workload"], cfg["samples"])
    hand_loader = DataLoader(data, cfg["batch"], sampler=DistributedSampler(data))
    loop_loader = ddpkit.prepare_loader(data, cfg["batch"])
    loop = ddpkit.TrainLoop({"model": model, "optimizer": optimizer})
    ways = {"hand": lambda r: hand_epoch(model, optimizer, hand_loader, r),
            "loop": lambda r: loop_batches(loop, model, optimizer, loop_loader)}  # fmt: skip
    if cfg["same"]:  # an A/A run: the hand-written loop both ways, over loaders of its own
        again = DataLoader(data, cfg["batch"], sampler=DistributedSampler(data))
        ways["loop"] = lambda r: hand_epoch(model, optimizer, again, r)
    times: dict[str, list[float]] = {"hand": [], "loop": []}
    body_ended = None
    for round_ in loop.epochs(cfg["rounds"] + 1):  # round 0 warms up (DDP's buckets, caches)
        if round_ > 1 and body_ended is not None:  # the loop's previous epoch end, its line
            times["loop"][-1] += (time.perf_counter() - body_ended) / len(loop_loader)
        for name in ("hand", "loop") if round_ % 2 else ("loop", "hand"):
            seconds = ways[name](round_)
            if round_:
                times[name].append(seconds)
        body_ended = time.perf_counter()
    if body_ended is not None:
        times["loop"][-1] += (time.perf_counter() - body_ended) / len(loop_loader)
    ddpkit.shutdown()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="epochs of each, alternating")
    parser.add_argument("--workloads", default="cnn,mlp")
    parser.add_argument("--batch", type=int, default=64, help="samples per worker per step")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--same", action="store_true",
                        help="the hand-written loop both ways: the ratio's spread when nothing "
                        "differs (an A/A run)")  # fmt: skip
    args = parser.parse_args()
    print(f"2 workers x 1 thread, batch {args.batch} per worker, {args.rounds} rounds, each "
          "way once a round in the same workers, the order alternating")  # fmt: skip
    for workload in args.workloads.split(","):
        cfg = {"workload": workload, "threads": 1, "rounds": args.rounds,
               "batch": args.batch, "samples": args.samples, "same": args.same}  # fmt: skip
        times = ddpkit.spawn(worker, 2, cfg)[0]
        hand, loop = times["hand"], times["loop"]
        ratios = [mine / theirs for mine, theirs in zip(loop, hand, strict=True)]
        print(f"{workload}: TrainLoop / hand-written, median of the rounds' ratios "
              f"{statistics.median(ratios):.3f} (fastest {min(loop) / min(hand):.3f}); "
              f"hand {statistics.median(hand) * 1e3:.2f} ms/step, "
              f"loop {statistics.median(loop) * 1e3:.2f} ms/step")  # fmt: skip


if __name__ == "__main__":
    main()
