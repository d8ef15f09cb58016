"""Activation checkpointing side by side: the activations kept for backward, peak memory and
step time of a deep model with and without recomputation, under DDP and FSDP.

One 2-worker job (gloo on loopback) trains a stack of residual MLP blocks under each
configuration in turn, alternating the order every round. Per configuration it reports the
bytes autograd kept for backward in one step (counted exactly by a saved-tensors hook), the
rise of the process's peak memory over the step (resident set on CPU, CUDA's max allocated
on a GPU) and the median step time. Times are comparable only within one run.

    .venv/bin/python benchmarks/activation_memory.py              # 2 workers, 16 blocks
    .venv/bin/python benchmarks/activation_memory.py --blocks 4 --rounds 1   # a quick look
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from torch import nn

import ddpkit
from ddpkit.runtime.memory import peak_memory_bytes, reset_peak_memory


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def make_model(width: int, blocks: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(Block(width) for _ in range(blocks)), nn.Linear(width, 10))


CONFIGS: dict[str, dict[str, Any]] = {
    "ddp": {"strategy": "ddp"},
    "ddp + recompute": {"strategy": "ddp", "activation_checkpointing": (Block,)},
    "fsdp": {"strategy": "fsdp", "fsdp_units": (Block,)},
    "fsdp + recompute": {
        "strategy": "fsdp", "fsdp_units": (Block,), "activation_checkpointing": True,
    },
}  # fmt: skip


def measure(config: dict[str, Any], args: argparse.Namespace) -> tuple[int, int, float]:
    """(bytes kept for backward, peak rise in bytes, median step seconds) of one config."""
    model = ddpkit.prepare_model(make_model(args.width, args.blocks), **config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    device = ddpkit.current_world().device
    inputs = torch.randn(args.batch, args.width, device=device)
    targets = torch.randint(0, 10, (args.batch,), device=device)
    kept, rises, times = 0, [], []
    for step in range(args.steps + 1):  # the first step warms up (Adam's state appears)
        kept = 0

        def count(t: torch.Tensor) -> torch.Tensor:
            nonlocal kept
            kept += t.numel() * t.element_size()
            return t

        reset_peak_memory(device)
        before, start = peak_memory_bytes(device), time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ddpkit.barrier()
        if step:
            times.append(time.perf_counter() - start)
            rises.append(peak_memory_bytes(device) - before)
    return kept, int(statistics.median(rises)), statistics.median(times)


def worker(args: argparse.Namespace) -> dict[str, tuple[int, int, float]]:
    ddpkit.init(timeout=600)
    names = list(CONFIGS)
    results: dict[str, list[tuple[int, int, float]]] = {name: [] for name in names}
    for round_index in range(args.rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            results[name].append(measure(CONFIGS[name], args))
    return {
        name: (runs[-1][0], statistics.median(r[1] for r in runs),
               statistics.median(r[2] for r in runs))
        for name, runs in results.items()
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--batch", type=int, default=512, help="samples per device per step")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    args = parser.parse_args()
    results = ddpkit.spawn(worker, args.workers, args)[0]
    params = sum(p.numel() for p in make_model(args.width, args.blocks).parameters())
    print(
        f"\n{args.workers} workers, {args.blocks} residual MLP blocks ({params / 1e6:.2f}M "
        f"parameters), batch {args.batch} per device, median of {args.rounds} x {args.steps} "
        "steps\n"
    )
    print("| configuration | kept for backward | peak rise in a step | step time | vs off |")
    print("|---|---|---|---|---|")
    for name, (kept, rise, seconds) in results.items():
        base = results[name.removesuffix(" + recompute")][2]
        print(f"| {name} | {kept / 2**20:.1f} MiB | {rise / 2**20:.1f} MiB | "
              f"{seconds * 1e3:.1f} ms | {seconds / base:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
