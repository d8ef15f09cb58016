"""Parity: ddpkit against a hand-written torch DDP loop (the tutorials' style), side by side.

Two workloads: a compute-bound small CNN on 32x32 inputs and a communication-heavy MLP of
about 1.6M parameters. For each, the same model, data, batch and SGD run as

- ``single``: one process, no DDP, a plain loop (the baseline for speedup);
- ``independent``: N such processes side by side, no communication: the machine's ceiling
  (on a machine whose cores share caches or memory bandwidth it is below N);
- ``raw``: the tutorials' loop: torch.multiprocessing.spawn, init_process_group, DDP,
  DistributedSampler, set_epoch, forward / backward / step;
- ``ddpkit``: ddpkit.spawn, prepare_model, prepare_loader, Trainer.fit with default settings;
- ``ddpkit step``: the same Trainer given the step as a function (``training_step=fn``
  returning the loss): what a custom step costs against the default classifier step;
- ``ddpkit loop``: a hand-written loop through ``ddpkit.TrainLoop`` (backward and
  optimizer_step marked, no checkpoints), against the tutorials' loop it replaces;
- ``ddpkit compiled``: ``prepare_model(model, compile=True)`` (inductor; compiling happens
  in the first epoch, which is not timed), against ``ddpkit`` eager;
- ``ddpkit tuned`` (MLP only): the same with comm_hook="bf16" and a larger gradient bucket;
- ``accelerate``: HF Accelerate's loop, when it is installed (``pip install -e ".[peers]"``).

Runs alternate between variants, each a fresh launch, and the median of ``--repeat`` runs is
reported: step time (epoch time / steps, measured inside the workers), ddpkit/raw ratio and
the N-worker speedup over ``single`` (throughput ratio; N is the limit). Every worker gets
``--threads`` CPU threads, so on 2 cores 2 workers x 1 thread is the machine's full width.

    .venv/bin/python benchmarks/parity.py                     # full: ~5 minutes on 2 cores
    .venv/bin/python benchmarks/parity.py --tiny              # smoke: seconds
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ddpkit


class Net(nn.Module):
    """The layers in a class of its own: under DDP torch.compile skips a bare nn.Sequential
    (its forward is torch.nn's own frame after DDP's graph break) and ran it eagerly."""

    def __init__(self, layers: nn.Sequential) -> None:
        super().__init__()
        self.layers = layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def make_model(workload: str) -> nn.Module:
    torch.manual_seed(0)
    if workload == "cnn":
        return Net(nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10),
        ))  # fmt: skip
    return Net(nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 768), nn.ReLU(),
                             nn.Linear(768, 10)))  # fmt: skip


def make_data(workload: str, samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    shape = (3, 32, 32) if workload == "cnn" else (784,)
    x = torch.randn(samples, *shape, generator=generator)
    return TensorDataset(x, torch.randint(0, 10, (samples,), generator=generator))


def timed_epochs(step_fn: Any, loader: DataLoader, sampler: Any, epochs: int) -> float:
    """Seconds per step over ``epochs`` epochs after one warm-up epoch."""
    times = []
    for epoch in range(epochs + 1):
        if sampler is not None:
            sampler.set_epoch(epoch)
        start = time.perf_counter()
        for inputs, targets in loader:
            step_fn(inputs, targets)
        times.append((time.perf_counter() - start) / len(loader))
    return statistics.median(times[1:])


def plain_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    def step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(inputs), targets).backward()
        optimizer.step()

    return step


def single_run(cfg: dict[str, Any]) -> float:
    """One process, no DDP: the speedup baseline."""
    torch.set_num_threads(cfg["threads"])
    model = make_model(cfg["workload"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(make_data(cfg["workload"], cfg["samples"]), cfg["batch"], shuffle=True)
    return timed_epochs(plain_step(model, optimizer), loader, None, cfg["epochs"])


def independent_run(cfg: dict[str, Any]) -> float:
    """N single processes side by side, no communication: the machine's own ceiling."""
    with mp.get_context("spawn").Pool(cfg["workers"]) as pool:
        return statistics.median(pool.map(single_run, [cfg] * cfg["workers"]))


def raw_worker(rank: int, cfg: dict[str, Any], result: str) -> None:
    """The tutorials' hand-written DDP loop."""
    torch.set_num_threads(cfg["threads"])
    dist.init_process_group("gloo", rank=rank, world_size=cfg["workers"])
    model = nn.parallel.DistributedDataParallel(make_model(cfg["workload"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = make_data(cfg["workload"], cfg["samples"])
    sampler: DistributedSampler[Any] = DistributedSampler(data)
    loader = DataLoader(data, cfg["batch"], sampler=sampler)
    seconds = timed_epochs(plain_step(model, optimizer), loader, sampler, cfg["epochs"])
    if rank == 0:
        Path(result).write_text(json.dumps(seconds))
    # Free DDP before the group: if DDP's reducer holds the group's last reference, torch
    # 2.13 destroys the gloo group under the GIL and can deadlock with its worker threads
    # (or abort: "terminate called without an active exception"). DDP sits in reference
    # cycles, so `del` alone does not free it: collect them, as ddpkit.shutdown() does.
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


def raw_run(cfg: dict[str, Any]) -> float:
    with tempfile.TemporaryDirectory() as folder:
        result = os.path.join(folder, "result.json")
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        mp.spawn(raw_worker, args=(cfg, result), nprocs=cfg["workers"])
        return float(json.loads(Path(result).read_text()))


def ddpkit_worker(cfg: dict[str, Any], options: dict[str, Any], mode: str) -> float:
    """The same job through ddpkit's public API: the Trainer's default step, a step
    function, or a hand-written loop through TrainLoop (``mode``)."""
    torch.set_num_threads(cfg["threads"])
    ddpkit.init()
    model = ddpkit.prepare_model(make_model(cfg["workload"]), **options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = ddpkit.prepare_loader(make_data(cfg["workload"], cfg["samples"]), cfg["batch"])
    if mode == "loop":
        return loop_epochs(model, optimizer, loader, cfg["epochs"])
    step = (lambda batch: F.cross_entropy(model(batch[0]), batch[1])) if mode == "step" else None
    loss_fn = None if step else F.cross_entropy
    trainer = ddpkit.Trainer(model, optimizer, loss_fn, training_step=step)
    history = trainer.fit(loader, epochs=cfg["epochs"] + 1)
    return statistics.median(h["time_s"] / len(loader) for h in history[1:])


def loop_epochs(model: nn.Module, optimizer: Any, loader: DataLoader, epochs: int) -> float:
    """Median step time of a hand-written loop through TrainLoop (first epoch: warm-up)."""
    loop = ddpkit.TrainLoop({"model": model, "optimizer": optimizer})
    times = []
    for _ in loop.epochs(epochs + 1):
        start = time.perf_counter()
        for inputs, targets in loop.batches(loader):
            loop.backward(F.cross_entropy(model(inputs), targets))
            loop.optimizer_step(optimizer)
        times.append((time.perf_counter() - start) / len(loader))
    return statistics.median(times[1:])


def ddpkit_run(cfg: dict[str, Any], options: dict[str, Any], mode: str = "default") -> float:
    return float(ddpkit.spawn(ddpkit_worker, cfg["workers"], cfg, options, mode)[0])


def accelerate_worker(cfg: dict[str, Any]) -> float:
    """The same loop through HF Accelerate (a peer), launched by the same launcher."""
    from accelerate import Accelerator

    torch.set_num_threads(cfg["threads"])
    accelerator = Accelerator(cpu=True)
    model = make_model(cfg["workload"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = make_data(cfg["workload"], cfg["samples"])
    loader = DataLoader(data, cfg["batch"], shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    def step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        accelerator.backward(F.cross_entropy(model(inputs), targets))
        optimizer.step()

    return timed_epochs(step, loader, None, cfg["epochs"])


def peer_run(cfg: dict[str, Any], worker: Any) -> float:
    return float(ddpkit.spawn(worker, cfg["workers"], cfg)[0])


def variants(workload: str) -> dict[str, Any]:
    found: dict[str, Any] = {
        "single": single_run,
        "independent": independent_run,
        "raw": raw_run,
        "ddpkit": lambda cfg: ddpkit_run(cfg, {}),
        "ddpkit step": lambda cfg: ddpkit_run(cfg, {}, "step"),
        "ddpkit loop": lambda cfg: ddpkit_run(cfg, {}, "loop"),
        # torch.compile after DDP; compiling happens in the first, untimed epoch
        "ddpkit compiled": lambda cfg: ddpkit_run(cfg, {"compile": True}),
    }
    if workload == "mlp":
        tuned = {"strategy": ddpkit.DDPStrategy(comm_hook="bf16", bucket_cap_mb=50)}
        found["ddpkit tuned"] = lambda cfg: ddpkit_run(cfg, tuned)
    if importlib.util.find_spec("accelerate") is not None:  # the optional `peers` extra
        found["accelerate"] = lambda cfg: peer_run(cfg, accelerate_worker)
    return found


def measure(workload: str, args: argparse.Namespace) -> dict[str, list[float]]:
    cfg = {"workload": workload, "workers": args.workers, "threads": args.threads,
           "batch": args.batch, "samples": args.samples, "epochs": args.epochs}  # fmt: skip
    chosen = [n for n in variants(workload) if not args.variants or n in args.variants]
    runs: dict[str, list[float]] = {name: [] for name in chosen}
    for repeat in range(args.repeat):
        names = list(runs) if repeat % 2 == 0 else list(runs)[::-1]  # alternate the order
        for name in names:
            runs[name].append(variants(workload)[name](cfg))
    return runs


def report(workload: str, runs: dict[str, list[float]], workers: int) -> list[str]:
    """One row per variant: the median step time and its ratio to raw's median, the median
    of each round's ratio to the raw run next to it (paired: a machine that slows for a
    while slows both), the fastest run's ratio to raw's fastest, the speedup."""
    steps = {name: statistics.median(times) for name, times in runs.items()}
    single, raw = steps.get("single"), steps.get("raw")
    lines = []
    for name, seconds in steps.items():
        factor = 1 if name == "single" else workers
        speedup = f"{single / seconds * factor:.2f}x" if single else "-"
        own = name in ("single", "independent", "raw") or raw is None
        vs_raw = "-" if own else f"{seconds / raw:.3f}"
        fastest = "-" if own else f"{min(runs[name]) / min(runs['raw']):.3f}"
        paired = "-" if own else f"{_paired_ratio(runs[name], runs['raw']):.3f}"
        lines.append(f"| {workload} | {name} | {seconds * 1e3:.2f} ms | {vs_raw} | {paired} | "
                     f"{fastest} | {speedup} |")  # fmt: skip
    return lines


def _paired_ratio(times: list[float], raw: list[float]) -> float:
    """The median of each round's ratio: the variant's run over the raw run of its round."""
    return statistics.median(mine / theirs for mine, theirs in zip(times, raw, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per worker")
    parser.add_argument("--batch", type=int, default=64, help="samples per worker per step")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per run")
    parser.add_argument("--repeat", type=int, default=5, help="runs per variant (median)")
    parser.add_argument(
        "--variants",
        type=lambda text: text.split(","),
        default=None,
        help="comma-separated variant names to run (default: all), e.g. raw,ddpkit",
    )
    parser.add_argument("--workloads", default="cnn,mlp")
    parser.add_argument("--tiny", action="store_true", help="smoke-test sizes")
    args = parser.parse_args()
    if args.tiny:
        args.samples, args.epochs, args.repeat, args.batch = 256, 1, 1, 32
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    lines = ["| workload | variant | step time | vs raw | paired vs raw | fastest vs raw | "
             "speedup vs 1 process |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for workload in args.workloads.split(","):
        lines += report(workload, measure(workload, args), args.workers)
    print(f"\n{args.workers} workers x {args.threads} thread(s), batch {args.batch} per worker, "
          f"median (and fastest) of {args.repeat} alternating runs\n")  # fmt: skip
    print("\n".join(lines))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


if __name__ == "__main__":
    main()
