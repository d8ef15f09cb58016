"""What a DataLoader worker costs per batch: the floor under which ddpkit's data-bound report
stays silent (``ddpkit.observe.ranktimes.DATA_MIN_MS``).

A batch of 32 tiny generated samples (a toy stream) is loaded in the training process
(``num_workers=0``) and through 1 and 2 workers; the fastest of a few passes per setting is
printed in milliseconds per batch. Where the in-process time per batch is below what a worker
adds, "give the loader workers" would make the job slower, so the report must not say it.

    .venv/bin/python benchmarks/loader_handoff.py
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset


class ToyStream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """``count`` random 8-feature samples with their sum as the target."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.count):
            x = torch.randn(8)
            yield x, x.sum(0, keepdim=True)


def ms_per_batch(workers: int, batches: int, passes: int) -> float:
    """The fastest pass's milliseconds per batch (the first batch, the workers' start, aside)."""
    best = float("inf")
    for _ in range(passes):
        batches_of = iter(DataLoader(ToyStream(32 * (batches + 1)), batch_size=32,
                                     num_workers=workers))  # fmt: skip
        next(batches_of)
        start = time.perf_counter()
        count = sum(1 for _ in batches_of)
        best = min(best, (time.perf_counter() - start) / count)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    inline = ms_per_batch(0, args.batches, args.passes)
    print(f"num_workers=0: {inline:.2f} ms per batch")
    for workers in (1, 2):
        took = ms_per_batch(workers, args.batches, args.passes)
        print(f"num_workers={workers}: {took:.2f} ms per batch ({took / inline:.1f}x in-process)")


if __name__ == "__main__":
    main()
