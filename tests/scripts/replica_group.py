"""One replica group of a fault-tolerant job (FaultTolerantStrategy), as ``ddpkit run``
starts it: ``DDPKIT_FT_GROUP`` names the group, ``TORCHFT_LIGHTHOUSE`` the lighthouse.

``python replica_group.py OUT STEPS``: trains a small model with TrainLoop for STEPS
optimizer steps, one batch a step with a pause so that a test can kill it mid-run;
prints ``step N`` after each step and writes the final weights to OUT. Every group trains
on the same batches (the data is not yet dealt between groups).
"""

import sys
import time

import torch
import torch.nn.functional as F

import ddpkit
from ddpkit.parallel.faulttolerant import FaultTolerantStrategy


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner, self.outer = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(torch.relu(self.inner(x)))


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    ddpkit.init(hang_timeout=0)
    torch.manual_seed(int(time.time_ns()) % 1000)  # groups start apart: the first heals them
    model = ddpkit.prepare_model(Net(), FaultTolerantStrategy(timeout_s=10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,), generator=generator))
        for _ in range(steps)
    ]
    loop = ddpkit.TrainLoop({"model": model, "optimizer": opt})
    for _ in loop.epochs(1000):
        for x, y in loop.batches(batches):
            loop.backward(F.cross_entropy(model(x), y))
            loop.optimizer_step()
            print(f"step {loop.run.step}", flush=True)
            if loop.run.step >= steps:
                torch.save(ddpkit.unwrap_model(model).state_dict(), out)
                return
            time.sleep(0.1)


if __name__ == "__main__":
    main()
