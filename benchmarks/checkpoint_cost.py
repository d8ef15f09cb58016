"""What the checkpoint checksum costs: a 25M-parameter model with Adam state (about 286 MB).

Saves and loads the same state as plain ``torch.save`` / ``torch.load(weights_only=True)``
(written atomically alike) and as ddpkit's sealed checkpoint (SHA-256 of the contents,
checked on load), alternately, and prints the median of each and the digest's own speed.

    .venv/bin/python benchmarks/checkpoint_cost.py --rounds 3
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

from ddpkit.checkpoint import atomic_write, load_checkpoint, save_checkpoint
from ddpkit.checkpoint.integrity import content_digest


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=25, help="1000x1000 layers (1M each)")
    args = parser.parse_args()
    state = model_and_adam_state(args.layers)
    megabytes = 3 * args.layers * 1000 * 1000 * 4 / 2**20
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
