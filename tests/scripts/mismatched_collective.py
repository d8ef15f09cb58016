"""Ranks call the same collective with different shapes: a bug gloo may not notice."""

import torch

import ddpkit


def main() -> None:
    world = ddpkit.init()
    ddpkit.all_reduce_sum(torch.ones(3 if world.rank == 0 else 4))


if __name__ == "__main__":
    main()
