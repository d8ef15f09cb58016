"""A compiled model's job with one worker killed (SIGKILL) at the start of its second epoch,
restarted by the launcher (``--max-restarts 1``) on "a new node": the restarted attempt's
``/tmp`` is empty (``TMPDIR`` of its own), so torch's default compile cache is gone.

``python compiled_restart_job.py WAY FOLDER``, under a launcher, 2 workers, gloo:

- ``ddpkit``: ``prepare_model(compile=True)`` and the Trainer with ``checkpoint_dir=FOLDER``
  (a checkpoint each epoch; the compiled kernels kept with it);
- ``hand``: the tutorials' equivalent: DDP, ``torch.compile``, rank 0 ``torch.save`` each
  epoch, resume from the newest file.

Rank 1 writes the time it is killed to ``FOLDER/killed``; rank 0 of the restarted attempt
writes the time its first step after the restart ended to ``FOLDER/resumed``.
"""

import os
import signal
import sys
import time
from pathlib import Path

WAY, FOLDER = sys.argv[1], Path(sys.argv[2])
OWN_CACHE_ENV = "BENCH_OWN_INDUCTOR_CACHE"  # 1: TORCHINDUCTOR_CACHE_DIR in each node's scratch
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
if ATTEMPT > 0:  # a new node: an empty /tmp (torch's default compile cache lives there)
    fresh = FOLDER.parent / f"{FOLDER.name}-node-{ATTEMPT}-{os.environ['LOCAL_RANK']}"
    fresh.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(fresh)
    import tempfile

    tempfile.tempdir = None  # read TMPDIR again, whatever ran before the script
if os.environ.get(OWN_CACHE_ENV):  # the user's own compile cache: a node-local scratch
    node = f"{FOLDER.name}-node-{ATTEMPT}-{os.environ['LOCAL_RANK']}"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(FOLDER.parent / node / "scratch")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

EPOCHS, STEPS = 3, 8
torch.set_num_threads(1)


class Block(torch.nn.Module):
    """A residual MLP block: what the compiler fuses (norm, activation, residual add)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.up = torch.nn.LayerNorm(128), torch.nn.Linear(128, 256)
        self.down = torch.nn.Linear(256, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(Block() for _ in range(16)), torch.nn.Linear(128, 10))


def data() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(STEPS * 32, 128, generator=generator),
                         torch.randint(0, 10, (STEPS * 32,), generator=generator))  # fmt: skip


def marks(epoch: int, step_in_attempt: int, rank: int) -> None:
    """The kill at the second epoch's start (first attempt), the first step after it."""
    if ATTEMPT == 0 and epoch == 1 and rank == 1:
        (FOLDER / "killed").write_text(str(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    if ATTEMPT > 0 and step_in_attempt == 1 and rank == 0:
        (FOLDER / "resumed").write_text(str(time.time()))


def hand() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.compile(torch.nn.parallel.DistributedDataParallel(make_model()))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    saved = sorted(FOLDER.glob("epoch_*.pt"))
    start = 0
    if saved:
        state = torch.load(saved[-1], weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"]
    sampler = DistributedSampler(data())
    loader = DataLoader(data(), batch_size=16, sampler=sampler)
    done = 0
    for epoch in range(start, EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in loader:
            marks(epoch, done, rank)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            done += 1
            marks(epoch, done, rank)
        if rank == 0:
            state = {"model": model.module.state_dict(),
                     "optimizer": optimizer.state_dict(), "epoch": epoch + 1}  # fmt: skip
            torch.save(state, FOLDER / f"epoch_{epoch + 1:03d}.pt")
        dist.barrier()
    dist.destroy_process_group()


def with_ddpkit() -> None:
    import ddpkit

    world = ddpkit.init()
    model = ddpkit.prepare_model(make_model(), compile=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    class Marks(ddpkit.Callback):
        rank_zero_only = False
        done = 0

        def on_train_batch_start(self, trainer, batch) -> None:  # type: ignore[no-untyped-def]
            marks(trainer.epoch, self.done, world.rank)

        def on_train_batch_end(self, trainer, batch, metrics) -> None:  # type: ignore[no-untyped-def]
            self.done += 1
            marks(trainer.epoch, self.done, world.rank)

    trainer = ddpkit.Trainer(model, optimizer, F.cross_entropy, checkpoint_dir=FOLDER,
                             save_every=1, callbacks=[Marks()])  # fmt: skip
    trainer.fit(ddpkit.prepare_loader(data(), batch_size=16), epochs=EPOCHS)


if __name__ == "__main__":
    FOLDER.mkdir(parents=True, exist_ok=True)
    hand() if WAY == "hand" else with_ddpkit()
