"""The job benchmarks/ft_recovery.py kills: a small model trained one batch a step, with a
pause a step before its update (so that steps take about as long on both sides), printing
``step N committed C batches B at T`` (C: the steps every group committed, without replica
groups N; B: the batches of 4 samples those committed steps trained, every rank's and every
group's; T: when, by the worker's clock, read against the kill's: the console shows a line
up to half a second after it was printed).

    python ft_recovery_job.py ft EPOCHS         # a replica group (ddpkit.ReplicaGroups)
    python ft_recovery_job.py restart EPOCHS CHECKPOINT_DIR SAVE_EVERY_STEPS [async]   # DDP
"""

import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import ddpkit


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner, self.outer = torch.nn.Linear(16, 256), torch.nn.Linear(256, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(torch.relu(self.inner(x)))


def main() -> None:
    mode, epochs = sys.argv[1], int(sys.argv[2])
    ddpkit.init(seed=0, hang_timeout=0)
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(96, 16, generator=generator),
                         torch.randint(0, 4, (96,), generator=generator))  # fmt: skip
    model = ddpkit.prepare_model(Net())
    groups = ddpkit.ReplicaGroups(timeout=10) if mode == "ft" else None
    if groups is not None:
        batches, options = groups.batches(data, batch_size=4, seed=0), {"replica_groups": groups}
    else:
        batches = ddpkit.prepare_loader(data, batch_size=4, shuffle=True)
        options = {"checkpoint_dir": sys.argv[3], "save_every_steps": int(sys.argv[4]),
                   "async_save": sys.argv[5:] == ["async"]}  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loop = ddpkit.TrainLoop({"model": model, "optimizer": opt}, **options)
    for _ in loop.epochs(epochs):
        for x, y in loop.batches(batches):
            # the step's "compute": a real step spends its time before its update, and the
            # line below is then the body's last work (a kill after it finds the step kept)
            time.sleep(0.1)
            loop.backward(F.cross_entropy(model(x), y))
            loop.optimizer_step()
            if groups is not None:  # the slices of the steps every group committed
                done = groups.manager.manager.current_step()
                trained = sum(len(slices) for _, slices in batches.record)
            else:
                done, trained = loop.run.step, loop.run.step * ddpkit.current_world().world_size
            print(f"step {loop.run.step} committed {done} batches {trained} at {time.time():.3f}",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
