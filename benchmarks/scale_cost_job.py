"""The job benchmarks/scale_cost.py runs at each world size: a tiny Trainer job (a small MLP,
a few epochs, the step-time breakdown on, as by default) whose every rank counts what ddpkit
adds as the world grows, and writes it to OUT/rank{R}.json:

- every ``torch.distributed`` collective called from Python (DDP's gradient all-reduce runs in
  torch's C++ reducer and is not among them: what is counted is ddpkit's own), by phase: set-up,
  inside the steps, at the epochs' boundaries; calls, bytes sent, bytes received;
- the keys in the job's store at the end (rank 0: the store's server holds them all);
- the process's open file descriptors and threads at the end.

    ddpkit run --nproc 8 benchmarks/scale_cost_job.py OUT_DIR [EPOCHS]
    SCALE_SLOW_RANK=7:0.3 ddpkit run ...   # rank 7 sleeps 0.3 s in each step: a straggler
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import ddpkit

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
    "broadcast_object_list", "gather", "gather_object", "reduce", "reduce_scatter_tensor",
    "scatter", "scatter_object_list", "barrier", "monitored_barrier", "all_to_all_single",
)  # fmt: skip
GATHERING = ("all_gather", "all_gather_into_tensor", "all_gather_object", "gather", "gather_object")


def payload(value: Any) -> int:
    """The bytes a collective's argument carries: a tensor's, a list's, an object's pickle."""
    if isinstance(value, torch.Tensor):
        return value.nelement() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(payload(v) for v in value if isinstance(v, torch.Tensor))
    return len(pickle.dumps(value)) if value is not None else 0


class Counts:
    """Collectives by (phase, name): calls, bytes sent and bytes received on this rank."""

    def __init__(self) -> None:
        self.phase = "setup"
        self.calls: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()
        self.received: Counter[str] = Counter()

    def install(self) -> None:
        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if original is not None:
                setattr(dist, name, self._counted(name, original))

    def _counted(self, name: str, original: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            key = f"{self.phase}:{name}"
            sent = _sent(name, args, kwargs)
            self.calls[key] += 1
            self.sent[key] += sent
            if name in GATHERING:  # everyone's share arrives (on gather's destination)
                self.received[key] += sent * dist.get_world_size()
            return original(*args, **kwargs)

        return counted


def _sent(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The bytes this rank puts in: the input of a gather, the tensor of the others."""
    if name in ("all_gather", "all_gather_object", "gather_object"):
        return payload(args[1] if len(args) > 1 else kwargs.get("obj", kwargs.get("tensor")))
    if name in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        return payload(args[1] if len(args) > 1 else kwargs.get("input_tensor"))
    if name in ("barrier", "monitored_barrier"):
        return 0
    return payload(args[0] if args else next(iter(kwargs.values()), None))


class Phases(ddpkit.Callback):
    """Marks the phases: a batch's start to its end is a step; the rest of an epoch (its
    opening, its line and gathered times) is its boundary."""

    rank_zero_only = False  # every rank counts

    def __init__(self, counts: Counts) -> None:
        self.counts, self.steps, self.epochs = counts, 0, 0

    def on_train_batch_start(self, trainer: Any, batch: Any) -> None:
        self.counts.phase = "step"

    def on_train_batch_end(self, trainer: Any, batch: Any, metrics: Any) -> None:
        self.steps += 1
        self.counts.phase = "epoch"

    def on_train_epoch_start(self, trainer: Any, epoch: int) -> None:
        self.counts.phase = "epoch"

    def on_train_epoch_end(self, trainer: Any, metrics: Any) -> None:
        self.epochs += 1


def store_keys() -> int | None:
    """Keys in the job's store (its server's count; None where this torch hides it)."""
    from torch.distributed import distributed_c10d

    store = getattr(distributed_c10d, "_get_default_store", lambda: None)()
    try:
        return int(store.num_keys()) if store is not None else None
    except RuntimeError:
        return None


class Slow(ddpkit.Callback):
    """One rank slowed: it sleeps ``seconds`` at the start of each of its steps."""

    rank_zero_only = False

    def __init__(self, rank: int, seconds: float) -> None:
        self.slow, self.seconds = ddpkit.get_rank() == rank, seconds

    def on_train_batch_start(self, trainer: Any, batch: Any) -> None:
        if self.slow:
            time.sleep(self.seconds)


def main() -> None:
    out, epochs = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3
    counts = Counts()
    counts.install()  # before init: the set-up's collectives count too
    world = ddpkit.init(seed=0)
    generator = torch.Generator().manual_seed(0)
    samples = 64 * world.world_size  # 8 steps an epoch at every size
    data = TensorDataset(torch.randn(samples, 16, generator=generator),
                         torch.randint(0, 4, (samples,), generator=generator))  # fmt: skip
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = ddpkit.prepare_model(net)  # DDP
    phases = Phases(counts)
    slow = os.environ.get("SCALE_SLOW_RANK")
    slowed = [Slow(int(slow.split(":")[0]), float(slow.split(":")[1]))] if slow else []
    trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                             F.cross_entropy, callbacks=[phases, *slowed])  # fmt: skip
    trainer.fit(ddpkit.prepare_loader(data, batch_size=8), epochs=epochs)
    counts.phase = "end"
    found = {
        "rank": world.rank,
        "world_size": world.world_size,
        "steps": phases.steps,
        "epochs": phases.epochs,
        "calls": dict(counts.calls),
        "sent": dict(counts.sent),
        "received": dict(counts.received),
        "store_keys": store_keys() if world.rank == 0 else None,
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
    }
    (out / f"rank{world.rank}.json").write_text(json.dumps(found))
    ddpkit.shutdown()


if __name__ == "__main__":
    main()
