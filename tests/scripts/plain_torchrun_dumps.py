"""A plain torchrun script (no ddpkit) whose ranks dump torch's Flight Recorder, as an NCCL
job does on a timeout (TORCH_NCCL_DUMP_ON_TIMEOUT): rank 0 reduces a metric alone, times
out, and dumps; rank 1 dumps once its own work is done. Run with TORCH_FR_BUFFER_SIZE and
TORCH_FR_DUMP_TEMP_FILE set, under torchrun."""

import contextlib
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace  # what a user's script may call


def dump(rank: int) -> None:
    with open(f"{os.environ['TORCH_FR_DUMP_TEMP_FILE']}{rank}", "wb") as out:
        out.write(_dump_fr_trace(True, True, False))


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=4))
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 10))
    for _ in range(3):
        model(torch.randn(4, 10)).sum().backward()
    if rank == 0:
        with contextlib.suppress(RuntimeError):  # the collective times out
            dist.all_reduce(torch.ones(3))  # the metric, on rank 0 only
    else:
        time.sleep(2)
    dump(rank)
    time.sleep(3)  # both dumps written before either leaves


if __name__ == "__main__":
    main()
