"""Worker functions for the multi-process tests (module level, so spawn can pickle them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import ddpkit
import ddpkit.checkpoint.storage
import ddpkit.data.epochs


def toy_dataset(n: int = 40, features: int = 6, classes: int = 3) -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=generator)
    y = torch.randint(0, classes, (n,), generator=generator)
    return TensorDataset(x, y)


def toy_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in ddpkit.unwrap_model(model).state_dict().items()}


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest element-wise difference between two state dicts with the same keys."""
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def world_fields() -> dict[str, object]:
    world = ddpkit.init(timeout=60)
    return {
        "rank": world.rank,
        "world_size": world.world_size,
        "local_rank": world.local_rank,
        "node_rank": world.node_rank,
        "sum_of_ranks": ddpkit.all_reduce_sum(float(world.rank)),
    }


def sampler_indices(n: int, epochs: int) -> list[list[int]]:
    """The dataset indices this rank sees in each epoch."""
    ddpkit.init(timeout=60)
    data = TensorDataset(torch.arange(n))
    loader = ddpkit.prepare_loader(data, batch_size=3, shuffle=True)
    seen = []
    for epoch in range(epochs):
        ddpkit.data.epochs.set_epoch(loader, epoch)
        seen.append([int(i) for (batch,) in loader for i in batch])
    return seen


def sgd_steps(batch_size: int, epochs: int = 1, lr: float = 0.1) -> dict[str, torch.Tensor]:
    """Train the toy model with plain SGD through ddpkit; return the final parameters."""
    ddpkit.init(timeout=60)
    model = ddpkit.prepare_model(toy_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    trainer = ddpkit.Trainer(model, optimizer, F.cross_entropy)
    trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=batch_size), epochs=epochs)
    return cpu_state(model)


def crash_before_step(trainer: ddpkit.Trainer, step: int, error: type[Exception]) -> None:
    """Make ``trainer`` raise ``error`` just before optimizer step ``step``'s update: a crash
    to resume from, at a chosen place."""
    updater = trainer.loop.updater
    real_step = updater._step

    def step_unless_crashing(optimizers: list[torch.optim.Optimizer]) -> bool:
        if trainer.step + 1 == step:
            raise error(f"crash before step {step}")
        return real_step(optimizers)

    updater._step = step_unless_crashing  # type: ignore[method-assign]


def train_with_checkpoints(folder: str, epochs: int, save_every: int) -> dict[str, object]:
    """Adam on the toy task with checkpoints; records which epochs this rank saved."""
    ddpkit.init(timeout=60)
    saved: list[int] = []
    real_save = ddpkit.checkpoint.storage.save_sealed

    def recording_save(state, path):  # observe this rank's writes
        saved.append(state["epoch"])
        return real_save(state, path)

    ddpkit.checkpoint.storage.save_sealed = recording_save  # type: ignore[assignment]
    model = ddpkit.prepare_model(toy_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    trainer = ddpkit.Trainer(model, optimizer, F.cross_entropy, Path(folder), save_every=save_every)
    history = trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=4), epochs=epochs)
    return {"state": cpu_state(model), "saved": saved, "history": history}


def fail_on_rank(bad_rank: int) -> None:
    world = ddpkit.init(timeout=60)
    if world.rank == bad_rank:
        raise ValueError(f"boom on rank {world.rank}")
    ddpkit.barrier()  # the healthy rank waits here; the launcher must stop it


def init_with_url(url: str) -> dict[str, object]:
    """The tutorials' style: an explicit init URL, rank and world size."""
    import os

    rank = int(os.environ["RANK"])  # the test harness's launcher numbers the processes
    world = ddpkit.init(init_method=url, rank=rank, world_size=2, join_timeout=30)
    return {
        "sum_of_ranks": ddpkit.all_reduce_sum(float(world.rank)),
        "master": f"tcp://{world.master_addr}:{world.master_port}",
    }


def store_listen_addresses() -> list[str]:
    """Local addresses of sockets LISTENing on MASTER_PORT (the launcher's store)."""
    import os

    port = int(os.environ["MASTER_PORT"])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":
                found.append(address)
    return found


def evaluate_toy(n: int, shuffle: bool) -> dict[str, float]:
    """Evaluate the untrained toy model on an n-sample set (n need not divide by the world)."""
    ddpkit.init(timeout=60)
    model = ddpkit.prepare_model(toy_model())
    trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy)
    loader = ddpkit.prepare_loader(toy_dataset(n), batch_size=2, shuffle=shuffle)
    return trainer.evaluate(loader)


class TwoHeads(nn.Module):
    """A model whose second head never takes part in the loss."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(6, 8)
        self.used_head = nn.Linear(8, 3)
        self.unused_head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used_head(torch.relu(self.body(x)))


def train_two_heads(find_unused_parameters: bool) -> str:
    """Two epochs on TwoHeads; returns 'ok' or the error ddpkit raised."""
    ddpkit.init(timeout=60)
    strategy = ddpkit.DDPStrategy(find_unused_parameters=find_unused_parameters)
    model = ddpkit.prepare_model(TwoHeads(), strategy)
    trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy)
    try:
        trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=4), epochs=2)
    except ddpkit.ConfigError as err:
        return str(err)
    return "ok"


def batchnorm_types(sync_batchnorm: bool) -> list[str] | str:
    """Norm layer types after prepare_model, or the ConfigError it raised."""
    ddpkit.init(timeout=60)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    try:
        wrapped = ddpkit.prepare_model(model, sync_batchnorm=sync_batchnorm)
    except ddpkit.ConfigError as err:
        return str(err)
    modules = ddpkit.unwrap_model(wrapped).modules()
    return [type(m).__name__ for m in modules if "Norm" in type(m).__name__]


def sgd_steps_with(batch_size: int, accumulate: int, clip: float | None) -> dict[str, torch.Tensor]:
    """Like sgd_steps, with gradient accumulation and clipping."""
    ddpkit.init(timeout=60)
    model = ddpkit.prepare_model(toy_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    trainer = ddpkit.Trainer(
        model, optimizer, F.cross_entropy, accumulate=accumulate, clip_grad_norm=clip
    )
    trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=batch_size), epochs=1)
    return cpu_state(model)


class PerturbingSGD(torch.optim.SGD):
    """SGD that, on one rank at one step, also nudges a weight: a replica drifting away."""

    def __init__(self, params, lr: float, rank: int, at_step: int) -> None:
        super().__init__(params, lr=lr)
        self.rank, self.at_step, self.steps = rank, at_step, 0

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = super().step(closure)
        self.steps += 1
        if self.steps == self.at_step and ddpkit.get_rank() == self.rank:
            self.param_groups[0]["params"][2][0, 0] += 1e-3  # the second layer's weight
        return loss


def train_with_replica_checks(check_every: int, perturb_step: int) -> int:
    """Train with check_replicas_every; rank 1 drifts at ``perturb_step``. Returns steps made."""
    ddpkit.init(timeout=60)
    model = ddpkit.prepare_model(toy_model())
    optimizer = PerturbingSGD(model.parameters(), lr=0.1, rank=1, at_step=perturb_step)
    trainer = ddpkit.Trainer(model, optimizer, F.cross_entropy, check_replicas_every=check_every)
    trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=4), epochs=1)
    return trainer.step


def nan_loss_on_rank(bad_rank: int, policy: str) -> dict[str, object]:
    """Rank ``bad_rank``'s loss is NaN at its 3rd batch; the others' stays finite."""
    world = ddpkit.init(timeout=60)
    calls = {"n": 0}

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        value = F.cross_entropy(outputs, targets)
        return value * float("nan") if calls["n"] == 3 and world.rank == bad_rank else value

    model = ddpkit.prepare_model(toy_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = ddpkit.Trainer(model, optimizer, loss, nonfinite_loss=policy)
    trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=4), epochs=1)
    return {"state": cpu_state(model), "skipped": trainer.skipped_steps, "steps": trainer.step}


def gathered_for_metrics(n: int, shuffle: bool) -> dict[str, object]:
    """Every rank's predictions over a loader of ``n`` samples, gathered for a metric; also
    all_gather of uneven rows, a refused shape mismatch, and metrics named differently by rank."""
    from ddpkit.errors import ConfigError
    from ddpkit.train.steps import MetricSums

    world = ddpkit.init(timeout=60, seed=3)
    data = TensorDataset(torch.arange(float(n)), torch.arange(n) % 3)
    loader = ddpkit.prepare_loader(data, batch_size=2, shuffle=shuffle)
    outputs = [(x * 10, y) for x, y in loader]
    preds, labels = ddpkit.gather_for_metrics(
        (torch.cat([o for o, _ in outputs]), torch.cat([y for _, y in outputs])), loader
    )
    uneven = ddpkit.all_gather(torch.full((world.rank + 1, 2), world.rank))
    try:
        ddpkit.all_gather(torch.zeros(1, 2 + world.rank))
        mismatch = ""
    except ConfigError as err:
        mismatch = str(err)
    sums = MetricSums(world.device)
    sums.add({"loss": 1.0 + world.rank, f"only_rank{world.rank}": 1.0}, samples=1 + world.rank)
    return {"preds": preds.tolist(), "labels": labels.tolist(), "uneven": uneven.tolist(),
            "mismatch": mismatch, "metrics": sums.reduce()}  # fmt: skip


def nccl_flight_recorder() -> dict[str, Any]:
    """One GPU rank: an all_reduce over NCCL, then what its Flight Recorder holds."""
    import os

    from ddpkit.flightrecorder.records import recent_collectives

    world = ddpkit.init()
    tensor = torch.ones(3, device=world.device)
    torch.distributed.all_reduce(tensor)
    torch.cuda.synchronize()
    names = (
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TORCH_FR_DUMP_TEMP_FILE",
    )
    return {"backend": world.backend, "collectives": recent_collectives(),
            "env": {name: os.environ.get(name, "") for name in names}}  # fmt: skip


def cuda_internals() -> dict[str, Any]:
    """One GPU rank: what ddpkit._compat finds on this CUDA build of torch, and the DDP
    options a strategy object gives reaching torch's DDP over NCCL."""
    from ddpkit._compat.c10d import flight_recorder_dumpers
    from ddpkit._compat.inductor import _codecache, compile_counts, default_cache_dir

    world = ddpkit.init()
    strategy = ddpkit.DDPStrategy(bucket_cap_mb=3, gradient_as_bucket_view=True,
                                  find_unused_parameters=True)  # fmt: skip
    model = ddpkit.prepare_model(torch.nn.Linear(4, 4), strategy)
    ddp = [model.bucket_bytes_cap, model.gradient_as_bucket_view, model.find_unused_parameters]
    return {
        "backend": world.backend,
        "dumpers": sorted(f.__name__ for f in flight_recorder_dumpers()),
        "headers": _codecache() is not None,
        "counts": compile_counts() is not None,
        "cache": default_cache_dir(),
        "ddp": ddp,
    }


def metric_names_by_epoch(extra_on_rank1_in_epoch: int) -> list[list[str]]:
    """Four epochs of a TrainLoop where rank 1 records an extra metric in one epoch only:
    each epoch's metric names, as the history has them."""
    ddpkit.init(hang_timeout=0)
    model = ddpkit.prepare_model(toy_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loop = ddpkit.TrainLoop({"model": model, "optimizer": opt})
    loader = ddpkit.prepare_loader(toy_dataset(), batch_size=4)
    rank = ddpkit.current_world().rank
    for epoch in loop.epochs(4):
        for x, y in loop.batches(loader):
            loss = F.cross_entropy(model(x), y)
            loop.backward(loss)
            if rank == 1 and epoch == extra_on_rank1_in_epoch:
                loop.record({"loss": loss, "aux": 1.0})
            loop.optimizer_step(opt)
    names = [sorted(k for k in m if k in ("loss", "aux")) for m in loop.history]
    ddpkit.shutdown()
    return names


def memory_resume_where_launchers_differ(folder: str) -> object:
    """Rank 0 restarts (its second attempt) holding a memory snapshot; rank 1 is a host that
    just joined: its first attempt, no memory folder. Both must agree there is nothing to
    resume from memory (and not hang in a collective only one of them calls)."""
    import os

    from ddpkit._core.protocol import MEMORY_SNAPSHOTS_ENV
    from ddpkit.train.snapshots import MemorySnapshots, resume_from_memory

    rank = int(os.environ["RANK"])
    os.environ["TORCHELASTIC_RESTART_COUNT"] = "1" if rank == 0 else "0"
    if rank == 0:
        os.environ[MEMORY_SNAPSHOTS_ENV] = folder
    else:
        os.environ.pop(MEMORY_SNAPSHOTS_ENV, None)
    ddpkit.init(hang_timeout=30)
    snapshots = MemorySnapshots.from_environment(sharded=False)
    if snapshots is not None:
        snapshots.take({"epoch": 0, "step": 3, "model": {"w": torch.ones(2)}}, None, None)
    resumed = resume_from_memory(snapshots, loop=None)  # type: ignore[arg-type]  # not reached
    ddpkit.shutdown()
    return resumed
