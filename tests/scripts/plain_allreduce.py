"""A plain torchrun-style script: no ddpkit inside, only torchrun's environment contract."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = int(os.environ["RANK"])
value = torch.tensor([float(rank)])
dist.all_reduce(value)
print(f"rank {rank} of {os.environ['WORLD_SIZE']}: sum of ranks = {int(value.item())}", flush=True)
dist.destroy_process_group()
