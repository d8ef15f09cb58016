"""A job whose last rank is killed with SIGKILL in its first attempt (ddpkit run
--max-restarts 1).

    memory_restart.py OUT_DIR [KILL_AFTER_STEP]
    MEMORY_RESTART_STRATEGY=fsdp memory_restart.py ...   # sharded: each rank keeps its shards
    MEMORY_RESTART_PAUSE=K:FILE memory_restart.py ...     # a whole node is killed meanwhile
    MEMORY_RESTART_EPOCHS=3 memory_restart.py ...         # 3 epochs (2 unless said)

2 epochs of 40 steps (8 samples a rank a step), dropout (the random streams count), AdamW with a
schedule, a checkpoint folder written every 1000 steps (never, before the end: a restart can
only go on from memory); the run's last epoch is saved there, and a run of more epochs in the
same OUT_DIR resumes from it. With KILL_AFTER_STEP, the last rank of the first attempt kills itself
at the batch after that step (during the next step). Rank 0 writes the final parameters and the
epochs' metrics to OUT_DIR/final.pt, and the job's memory folder's name to
OUT_DIR/memory-folder. With MEMORY_RESTART_PAUSE=K:FILE every rank of the first attempt, after
step K, writes FILE.rank<R> and waits until FILE exists (a test kills a node meanwhile).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import ddpkit
from ddpkit._core.protocol import MEMORY_SNAPSHOTS_ENV
from ddpkit.parallel.strategy import strategy_of


def main() -> None:
    out = Path(sys.argv[1])
    kill_after = int(sys.argv[2]) if len(sys.argv) > 2 else None
    pause = os.environ.get("MEMORY_RESTART_PAUSE", "")
    pause_at, pause_file = (int(pause.split(":", 1)[0]), pause.split(":", 1)[1]) if pause else (
        None, "")  # fmt: skip
    world = ddpkit.init(seed=0)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))
    model = ddpkit.prepare_model(net, strategy=os.environ.get("MEMORY_RESTART_STRATEGY", "ddp"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
    generator = torch.Generator().manual_seed(1)
    samples = 320 * world.world_size  # 40 steps an epoch at any world size
    data = torch.utils.data.TensorDataset(
        torch.randn(samples, 6, generator=generator),
        torch.randint(0, 3, (samples,), generator=generator),
    )
    loader = ddpkit.prepare_loader(data, batch_size=8)
    parts = {"model": model, "optimizer": opt, "scheduler": schedule}
    loop = ddpkit.TrainLoop(parts, out / "checkpoints", save_every_steps=1000)
    for _epoch in loop.epochs(int(os.environ.get("MEMORY_RESTART_EPOCHS", "2"))):
        for x, y in loop.batches(loader):
            last = world.rank == world.world_size - 1  # rank 1 of 2 (the only one on 1 GPU)
            if loop.step == kill_after and last and world.restart == 0:
                os.kill(os.getpid(), signal.SIGKILL)  # in the middle of the next step
            if loop.step == pause_at and world.restart == 0:
                Path(f"{pause_file}.rank{world.rank}").touch()
                while not Path(pause_file).exists():
                    time.sleep(0.05)
            loop.backward(F.cross_entropy(model(x), y))
            if loop.optimizer_step(opt):
                schedule.step()
    weights = strategy_of(model).full_state(model)  # FSDP: a collective, every rank
    if ddpkit.is_main():
        (out / "memory-folder").write_text(os.environ.get(MEMORY_SNAPSHOTS_ENV, ""))
        torch.save({"weights": weights, "history": loop.history}, out / "final.pt")
    ddpkit.shutdown()


if __name__ == "__main__":
    main()
