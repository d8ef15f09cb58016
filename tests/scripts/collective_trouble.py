"""Collectives that ranks disagree on, in a loop of the user's own (plain DDP, plain
torch.distributed calls, ddpkit only for init and the step labels): MODE is

- ``rank0_only``: after its steps, rank 0 alone reduces a metric; rank 1 goes on to a
  long evaluation of its own, in its own code;
- ``sizes``: the ranks reduce tensors of different sizes;
- ``sigstop``: rank 1 stops itself (SIGSTOP) before its third backward;
- ``skip_backward``: rank 1 skips its third step's backward, then both reduce the loss.

STRATEGY (``ddp``, the default, or ``fsdp``) wraps the model; TIMEOUT_S, if given, is torch's
collective timeout (``ddpkit.init(timeout=)``; else ddpkit's default).
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import ddpkit
from ddpkit import watch
from ddpkit.runtime.session import DEFAULT_TIMEOUT_S


def main() -> None:
    mode, strategy = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "ddp")
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else DEFAULT_TIMEOUT_S
    world = ddpkit.init(seed=0, timeout=timeout)
    model = ddpkit.prepare_model(torch.nn.Sequential(torch.nn.Linear(10, 10)), strategy)
    rank = world.rank
    for step in range(1, 6):
        with watch(f"step {step}"):
            loss = model(torch.randn(4, 10)).sum()
            if mode == "sigstop" and step == 3 and rank == 1:
                os.kill(os.getpid(), signal.SIGSTOP)
            if mode == "skip_backward" and step == 3 and rank == 1:
                loss = loss.detach()  # this batch's backward is skipped on rank 1
            else:
                loss.backward()
            if mode == "skip_backward" and step == 3:
                dist.all_reduce(loss.detach().reshape(1))  # the step's loss, averaged
    with watch("the metric"):
        if mode == "rank0_only" and rank == 0:
            dist.all_reduce(torch.ones(3))  # the metric, reduced on rank 0 only
        if mode == "rank0_only" and rank == 1:
            time.sleep(3600)  # an evaluation of rank 1's own, in its own code
        if mode == "sizes":
            dist.all_reduce(torch.ones(7 if rank == 0 else 9))
    ddpkit.shutdown()


if __name__ == "__main__":
    main()
