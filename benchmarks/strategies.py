"""Strategies side by side: step time and per-rank memory of DDP, DDP + bf16 hook, FSDP, HSDP.

PowerSGD is left out: with torch 2.13 on gloo, after compressed PowerSGD steps on 512-wide
layers, building a new DDP model in the same process hung, and process exit intermittently
aborted ("terminate called without an active exception"; 1 run in 3). ddpkit warns when
PowerSGD is chosen on gloo.

One 2-worker job (gloo on loopback) trains the same MLP under each configuration in turn,
alternating the order every round, and reports per configuration the median step time and
the bytes each rank holds for parameters, gradients and Adam state. Times are comparable
only within one run; memory is exact.

    .venv/bin/python benchmarks/strategies.py                 # defaults: 2 workers, ~3.2M params
    .venv/bin/python benchmarks/strategies.py --workers 4     # HSDP as a 2x2 mesh
    .venv/bin/python benchmarks/strategies.py --width 512 --steps 5 --rounds 1   # a quick look
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

import ddpkit


def configs(hsdp_shard_size: int) -> dict[str, dict[str, Any]]:
    """The configurations compared; HSDP shards over ``hsdp_shard_size`` ranks per replica."""
    units = (nn.Linear,)
    return {
        "ddp": {"strategy": "ddp"},
        "ddp + bf16 hook": {"strategy": ddpkit.DDPStrategy(comm_hook="bf16")},
        "fsdp": {"strategy": ddpkit.FSDPStrategy(units=units)},
        f"hsdp (shard {hsdp_shard_size})": {
            "strategy": ddpkit.HSDPStrategy(units=units, shard_size=hsdp_shard_size),
        },
    }


def make_mlp(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10),
    )  # fmt: skip


def local_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes this rank holds for parameters, gradients and optimizer state (shards only)."""

    def size(t: torch.Tensor) -> int:
        local = t.to_local() if isinstance(t, DTensor) else t
        return local.numel() * local.element_size()

    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    grads = [p.grad for p in params if p.grad is not None]
    return sum(size(t) for t in [*params, *grads, *state])


WARMUP_STEPS = 3


def time_config(config: dict[str, Any], width: int, steps: int, batch: int) -> tuple[float, int]:
    """Median seconds per optimizer step (after the warm-up) and local state bytes."""
    model = ddpkit.prepare_model(make_mlp(width), **config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    device = ddpkit.current_world().device
    inputs, targets = torch.randn(batch, width, device=device), torch.randint(0, 10, (batch,))
    times = []
    for _ in range(WARMUP_STEPS + steps):
        start = time.perf_counter()
        F.cross_entropy(model(inputs), targets.to(device)).backward()
        optimizer.step()
        ddpkit.barrier()  # a step ends when every rank's step has ended
        times.append(time.perf_counter() - start)
    memory = local_bytes(model, optimizer)
    optimizer.zero_grad(set_to_none=True)
    return statistics.median(times[WARMUP_STEPS:]), memory


def worker(width: int, steps: int, batch: int, rounds: int, shard: int) -> dict[str, Any]:
    ddpkit.init(timeout=600)
    compared = configs(shard)
    names = list(compared)
    times: dict[str, list[float]] = {name: [] for name in names}
    memory: dict[str, int] = {}
    for round_index in range(rounds):
        order = names if round_index % 2 == 0 else names[::-1]  # alternate: fair to drift
        for name in order:
            seconds, memory[name] = time_config(compared[name], width, steps, batch)
            times[name].append(seconds)
    return {name: (statistics.median(times[name]), memory[name]) for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--width", type=int, default=1024, help="hidden width of the MLP")
    parser.add_argument("--batch", type=int, default=64, help="samples per device per step")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    parser.add_argument(
        "--hsdp-shard-size", type=int, default=None, help="default: half the workers (2x2 on 4)"
    )
    args = parser.parse_args()
    params = sum(p.numel() for p in make_mlp(args.width).parameters())
    shard = args.hsdp_shard_size or max(1, args.workers // 2)
    results = ddpkit.spawn(
        worker, args.workers, args.width, args.steps, args.batch, args.rounds, shard
    )
    base_time = results[0]["ddp"][0]
    print(
        f"\n{args.workers} workers, MLP of {params / 1e6:.2f}M parameters, Adam, batch "
        f"{args.batch} per device, median of {args.rounds} x {args.steps} steps after "
        f"{WARMUP_STEPS} warm-up steps\n"
    )
    print("| strategy | step time | vs ddp | state per rank (params + grads + Adam) |")
    print("|---|---|---|---|")
    for name, (seconds, memory) in results[0].items():
        ratio = seconds / base_time
        print(f"| {name} | {seconds * 1e3:.1f} ms | {ratio:.2f}x | {memory / 2**20:.1f} MiB |")


if __name__ == "__main__":
    main()
