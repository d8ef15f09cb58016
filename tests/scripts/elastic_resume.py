"""A job that records every sample it trains, to resume at another world size (ddpkit run).

    elastic_resume.py CHECKPOINT_DIR RECORDS_DIR [CRASH_AT_STEP]

960 samples, a global batch of 12 kept at every world size (``batch_policy="global"``: 6 per
device on 2 ranks, 12 on 1, 4 on 3), 80 steps an epoch, 2 epochs, a checkpoint every 4 steps.
Each rank appends ``epoch step id`` for every sample it trains (``step``: the update it was
in) to RECORDS_DIR/rank<R>-<pid>.txt. With CRASH_AT_STEP every rank raises before that
step's update (step 88's checkpoint is then the newest, 8 steps into epoch 2). Rank 0 writes
the final parameters to RECORDS_DIR/final.pt. ``ELASTIC_EPOCHS`` (default 2) and
``ELASTIC_STEP_S`` (a sleep per step, default 0) make a longer job for the membership tests;
``ELASTIC_GLOBAL_BATCH`` (default 12) and ``ELASTIC_SAMPLES`` (default 960) fit the scale
tier's world sizes (a global batch every size the job takes divides); ``ELASTIC_HOLD`` names
a file the test writes a step number S into: once at S, the job waits (polling with an
all-reduce, so a lost peer still fails the step) while the file holds S or less and no rank
is asked to stop, and rank 0 says ``held at step S (world W)``: the test, not the clock,
decides when a node goes and comes;
each file starts with ``# resumed at step S of world W at T`` (S 0: from scratch; T the
time, to order the attempts of an elastic job).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import ddpkit


def stop_asked() -> bool:
    """Whether torch's agent asked this worker to stop: ddpkit's loop notes SIGTERM and
    stops at the end of the step, which a held worker would never reach (torch's agent then
    kills it after 30 s, whatever its shutdown timeout, when it restarts for a new node)."""
    handler = signal.getsignal(signal.SIGTERM)
    return bool(getattr(getattr(handler, "__self__", None), "signum", 0))


def hold_until_released(hold: Path | None, step: int, world: ddpkit.World) -> None:
    """Wait at ``step`` while the hold file names it or a later step, every rank alike (the
    ranks agree by an all-reduce each poll, which also fails when a peer is gone); a stop
    asked of any rank releases them all, to stop together after the step."""
    said = False
    while hold is not None:
        try:
            at = int(hold.read_text())
        except (FileNotFoundError, ValueError):  # released: the test removed the file
            at = -1
        agreed = torch.tensor([1.0 if at >= 0 and step >= at and not stop_asked() else 0.0])
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        if not agreed.item():
            return
        if world.rank == 0 and not said:
            print(f"held at step {step} (world {world.world_size})", flush=True)
            said = True
        time.sleep(0.1)


def main() -> None:
    folder, records = sys.argv[1], Path(sys.argv[2])
    crash_at = int(sys.argv[3]) if len(sys.argv) > 3 else None
    world = ddpkit.init(seed=0)
    torch.manual_seed(0)
    model = ddpkit.prepare_model(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 3)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    samples = int(os.environ.get("ELASTIC_SAMPLES", "960"))
    data = torch.utils.data.TensorDataset(
        torch.randn(samples, 6, generator=generator),
        torch.randint(0, 3, (samples,), generator=generator),
        torch.arange(samples),
    )
    global_batch = int(os.environ.get("ELASTIC_GLOBAL_BATCH", "12"))
    loader = ddpkit.prepare_loader(data, batch_size=global_batch, batch_policy="global")
    loop = ddpkit.TrainLoop({"model": model, "optimizer": opt}, folder, save_every_steps=4)
    records.mkdir(parents=True, exist_ok=True)
    pause = float(os.environ.get("ELASTIC_STEP_S", "0"))
    hold = Path(os.environ["ELASTIC_HOLD"]) if "ELASTIC_HOLD" in os.environ else None
    with open(records / f"rank{world.rank}-{os.getpid()}.txt", "a", buffering=1) as seen:
        for epoch in loop.epochs(int(os.environ.get("ELASTIC_EPOCHS", "2"))):
            if seen.tell() == 0:
                seen.write(f"# resumed at step {loop.step} of world {world.world_size} "
                           f"at {time.time():.3f}\n")  # fmt: skip
            for x, y, ids in loop.batches(loader):
                hold_until_released(hold, loop.step, world)
                time.sleep(pause)
                step = loop.step + 1  # the update this batch makes
                if step == crash_at:
                    raise RuntimeError(f"crash before step {crash_at}")
                loop.backward(F.cross_entropy(model(x), y))
                loop.optimizer_step(opt)
                seen.writelines(f"{epoch} {step} {i}\n" for i in ids.tolist())
    state = {k: v.detach().cpu() for k, v in ddpkit.unwrap_model(model).state_dict().items()}
    if ddpkit.is_main():
        torch.save(state, records / "final.pt")
    ddpkit.shutdown()


if __name__ == "__main__":
    main()
