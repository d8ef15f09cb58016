"""One rank of a job that meets through a file:// URL, started by hand as the tutorial does:
``python join_file_store.py file:///PATH RANK WORLD_SIZE [hold]``. It prints "joined" once
an all-reduce over every rank worked; with ``hold`` it then waits to be killed."""

import sys
import time

import torch
import torch.distributed as dist

import ddpkit

url, rank, world_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ddpkit.init("gloo", init_method=url, rank=rank, world_size=world_size)
total = torch.tensor([1.0])
dist.all_reduce(total)
print(f"joined {int(total.item())}", flush=True)
if sys.argv[4:] == ["hold"]:
    time.sleep(600)
