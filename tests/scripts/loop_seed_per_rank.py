"""A hand-written loop (ddpkit.TrainLoop) with the classic mistake: seeding with the rank.

Each rank generates its own synthetic dataset (see seed_per_rank.py), so N workers do not
train what one process trains; `ddpkit verify` must say so, naming per-rank randomness.
"""

import torch.nn.functional as F
from seed_per_rank import seeded_per_rank_setup

import ddpkit


def main() -> None:
    model, optimizer, loader = seeded_per_rank_setup()
    loop = ddpkit.TrainLoop({"model": model, "optimizer": optimizer})
    for _epoch in loop.epochs(2):
        for x, y in loop.batches(loader):
            loop.backward(F.cross_entropy(model(x), y))
            loop.optimizer_step(optimizer)


if __name__ == "__main__":
    main()
