"""``ddpkit.spawn`` started from a warm forkserver vs Python's spawn method, side by side.

Each round calls ``ddpkit.spawn`` on a 2-worker job that joins the group and builds an Adam
optimizer (which imports torch._dynamo, as every training worker does), once with ddpkit's
forkserver (torch and torch._dynamo imported once, in the server) and once with the spawn
method (each worker a fresh interpreter), in alternating order. The first forkserver call
pays for the server's start and is reported apart.

    .venv/bin/python benchmarks/spawn_start.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch

import ddpkit
from ddpkit.launch.warm import interactive


def one_training_worker() -> int:
    world = ddpkit.init(timeout=120)
    torch.optim.Adam(torch.nn.Linear(2, 2).parameters())  # imports torch._dynamo
    return world.rank


def timed_spawn(method: str) -> float:
    start = time.perf_counter()
    if method == "spawn":
        with mock.patch.object(interactive, "warm_start_method", lambda: "spawn"):
            ddpkit.spawn(one_training_worker, 2)
    else:
        ddpkit.spawn(one_training_worker, 2)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    first = timed_spawn("forkserver")  # starts the server
    times: dict[str, list[float]] = {"forkserver": [], "spawn": []}
    for round_index in range(args.rounds):
        order = ["forkserver", "spawn"] if round_index % 2 == 0 else ["spawn", "forkserver"]
        for method in order:
            times[method].append(timed_spawn(method))
    warm, cold = statistics.median(times["forkserver"]), statistics.median(times["spawn"])
    print(f"\nfirst forkserver call (starts the server): {first:.2f} s")
    for method, median in (("forkserver", warm), ("spawn", cold)):
        fastest = min(times[method])
        print(f"{method}, median of {args.rounds}: {median:.2f} s (fastest {fastest:.2f})")
    print(f"ratio forkserver / spawn: {warm / cold:.3f}")


if __name__ == "__main__":
    main()
