"""The tutorials' minimal example: one linear layer, MSE, SGD, one step under DDP.

    python examples/linear.py                      # one process
    ddpkit run --nproc 2 examples/linear.py        # two, each printing its own loss

Each rank draws its own batch of 5 samples (seeded by rank), computes the loss, and takes one
SGD step; DDP averages the gradients, so every rank ends with the same weights, which it
prints a checksum of. The tutorial's version hard-codes ``init_process_group(backend='nccl',
rank=0, world_size=1)`` and ``cuda:0``; here ``ddpkit.init()`` reads the world from the
launcher and picks the backend and the device.
"""

from __future__ import annotations

import torch
from torch import nn

import ddpkit


def main() -> None:
    world = ddpkit.init(seed=0)  # the same initial weights on every rank
    model = ddpkit.prepare_model(nn.Linear(10, 1))  # DDP on world.device
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1000 + world.rank)  # each rank its own batch
    inputs = torch.randn(5, 10, generator=data).to(world.device)
    targets = torch.randn(5, 1, generator=data).to(world.device)

    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(inputs), targets)
    loss.backward()  # DDP all-reduces (averages) the gradients here
    optimizer.step()

    weights = sum(p.detach().sum().item() for p in model.parameters())
    line = (f"rank {world.rank} of {world.world_size}: loss {loss.item():.4f}, "
            f"weights sum to {weights:.6f} after one step\n")  # fmt: skip
    # One write: print() writes the text and the newline separately, and lines from ranks
    # that share the launcher's output could interleave.
    print(line, end="", flush=True)


if __name__ == "__main__":
    main()
