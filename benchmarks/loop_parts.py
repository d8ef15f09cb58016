"""Where TrainLoop's own time goes in a step, part by part, beside the hand-written loop's.

``loop_parity.py`` gives the ratio of whole epochs, whose rounds spread by several percent on
this machine; the loop's cost is about 1% of a GPT-2 step. Here the same 2 workers take a
hand step then a loop step, strictly in turn, as there, and time each part of each with
``perf_counter_ns``; the medians over every step of the rounds after the first are exact to a
microsecond or so:

- ``fetch``: from the end of the step's update to its next batch in hand. The hand's is
  ``next()`` of its ``DataLoader``; the loop's adds the step's end (metric sums, clock,
  console, hooks) and the generators between the loader and the body;
- ``backward``: the loop's ``backward()`` less torch's ``loss.backward()`` inside it (the
  NaN check's detach, the clock, the watchdog's label, the loss's share);
- ``update``: the loop's ``optimizer_step()`` less the update inside it (the guard's verdict,
  the clock, the label); the update itself (``opt.step()``, ``zero_grad``) is timed both ways.

Neither way's forward nor the release of its loss (the autograd graph, tens of microseconds)
is timed: they are the same calls both ways.

    GLOO_SOCKET_IFNAME=lo .venv/bin/python benchmarks/loop_parts.py            # ~1 minute
    GLOO_SOCKET_IFNAME=lo .venv/bin/python benchmarks/loop_parts.py --workload mlp --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from loop_parity import BATCH, shard, workload
from torch.utils.data import DataLoader

import ddpkit

now = time.perf_counter_ns
PARTS = ("hand fetch", "loop fetch", "hand update", "loop update (torch's)", "loop backward",
         "loop update")  # fmt: skip


def timed_inside(loop: ddpkit.TrainLoop, times: dict[str, int]) -> None:
    """Time torch's backward and the update inside the loop's calls (this loop's own parts,
    replaced on the instance, whatever their class does)."""
    precision, updater = loop.precision, loop.updater
    backward, update = precision.backward, updater._step

    def torch_backward(loss: torch.Tensor) -> None:
        start = now()
        backward(loss)
        times["backward"] = now() - start

    def the_update(optimizers: list[torch.optim.Optimizer]) -> bool:
        start = now()
        taken = update(optimizers)
        times["update"] = now() - start
        return taken

    precision.backward = torch_backward  # type: ignore[method-assign]
    updater._step = the_update  # type: ignore[method-assign]


def worker(cfg: dict[str, Any]) -> dict[str, float]:
    torch.set_num_threads(1)
    ddpkit.init()
    module, data, loss_of, make_optimizer = workload(cfg["workload"], cfg["samples"])
    model = ddpkit.prepare_model(module)
    optimizer = make_optimizer(model.parameters())
    hand_loader = DataLoader(data, BATCH[cfg["workload"]], sampler=shard(data))
    loop_loader = ddpkit.prepare_loader(data, BATCH[cfg["workload"]])
    parts: dict[str, list[int]] = {name: [] for name in PARTS}
    loop = ddpkit.TrainLoop({"model": model, "optimizer": optimizer})
    inside: dict[str, int] = {}
    timed_inside(loop, inside)
    for epoch in loop.epochs(cfg["rounds"]):
        hand_loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        hand_batches = iter(hand_loader)
        hand_batch, updated = next(hand_batches), None
        for batch in loop.batches(loop_loader):
            fetched = now()
            loss = loss_of(model, hand_batch)  # the hand step, the tutorials' loop
            loss.backward()
            del loss
            a = now()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            b = now()
            hand_batch = next(hand_batches, None)
            c = now()
            loss = loss_of(model, batch)  # the loop step
            d = now()
            loop.backward(loss)
            e = now()
            del loss  # the autograd graph's release, untimed both ways
            e2 = now()
            loop.optimizer_step(optimizer)
            f = now()
            if epoch == 0:  # the first round warms up
                updated = f
                continue
            if updated is not None:
                parts["loop fetch"].append(fetched - updated)
            parts["hand fetch"].append(c - b)
            parts["hand update"].append(b - a)
            parts["loop update (torch's)"].append(inside["update"])
            parts["loop backward"].append(e - d - inside["backward"])
            parts["loop update"].append(f - e2 - inside["update"])
            updated = f
    ddpkit.shutdown()
    return {name: statistics.median(values) / 1e3 for name, values in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="gpt2", choices=sorted(BATCH))
    parser.add_argument("--rounds", type=int, default=4, help="epochs; the first warms up")
    parser.add_argument("--samples", type=int, help="per epoch (default: loop_parity.py's)")
    args = parser.parse_args()
    cfg = {"workload": args.workload, "rounds": args.rounds, "samples": args.samples}
    medians = ddpkit.spawn(worker, 2, cfg)[0]  # rank 0's
    print(f"{args.workload}, 2 workers, medians of rank 0's steps after the first round (us):")
    for name in PARTS:
        print(f"  {name:24} {medians[name]:9.1f}")
    fetch = medians["loop fetch"] - medians["hand fetch"]
    own = fetch + medians["loop backward"] + medians["loop update"]
    print(f"the loop's own time a step: {own:.1f} us (fetch {fetch:+.1f}, backward "
          f"{medians['loop backward']:.1f}, update {medians['loop update']:.1f}; the epoch's "
          "end not included)")  # fmt: skip


if __name__ == "__main__":
    main()
