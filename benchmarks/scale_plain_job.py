"""The hand-written twin of benchmarks/scale_cost_job.py, as the tutorials write it (plain
torch: init_process_group, DistributedSampler, DDP, an epoch loop), for torchrun: the same
data, model, batch, epochs and optimizer, without ddpkit.

    torchrun --standalone --nproc-per-node 32 benchmarks/scale_plain_job.py [EPOCHS]
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    samples = 64 * world_size  # 8 steps an epoch at every size
    data = TensorDataset(torch.randn(samples, 16, generator=generator),
                         torch.randint(0, 4, (samples,), generator=generator))  # fmt: skip
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item(), 1.0])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch + 1}/{epochs} loss {total[0] / total[1]:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
