"""Rank 1 sleeps before prepare_model, whose DDP wrapping broadcasts rank 0's weights."""

import time

import torch

import ddpkit


def main() -> None:
    world = ddpkit.init()
    ddpkit.all_reduce_sum(1.0)  # everyone gets here: the group works
    if world.rank == 1:
        time.sleep(3600)  # stands for a rank that never builds its model (a crash-free bug)
    ddpkit.prepare_model(torch.nn.Linear(4, 2))
    print(f"rank {world.rank} finished", flush=True)


if __name__ == "__main__":
    main()
