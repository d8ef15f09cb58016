"""Activation checkpointing side by side: the activations kept for backward, peak memory and
step time of a deep model with and without recomputation, under DDP and FSDP.

A 2-worker job (gloo on loopback) per configuration and round, in alternating order, trains a
stack of residual MLP blocks for a few steps in fresh workers. Per configuration it reports
the bytes autograd kept for backward in one step (counted exactly by a saved-tensors hook),
rank 0's peak memory over the steps above its memory before them (resident set on CPU, CUDA's
max allocated on a GPU; it includes Adam's state, alike in both) and the median step time.
Times are comparable only within one run.

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
    "fsdp": {"strategy": ddpkit.FSDPStrategy(units=(Block,))},
    "fsdp + recompute": {
        "strategy": ddpkit.FSDPStrategy(units=(Block,)), "activation_checkpointing": True,
    },
}  # fmt: skip


def measure(name: str, args: argparse.Namespace) -> tuple[int, int, float]:
    """In a fresh worker: (bytes kept for backward in a step, the peak's rise over the steps
    above the memory before them, median step seconds) of configuration ``name``."""
    ddpkit.init(timeout=600)
    model = ddpkit.prepare_model(make_model(args.width, args.blocks), **CONFIGS[name])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    device = ddpkit.current_world().device
    inputs = torch.randn(args.batch, args.width, device=device)
    targets = torch.randint(0, 10, (args.batch,), device=device)
    kept, times = 0, []
    reset_peak_memory(device)
    before = peak_memory_bytes(device)
    for _ in range(args.steps):
        kept = 0

        def count(t: torch.Tensor) -> torch.Tensor:
            nonlocal kept
            kept += t.numel() * t.element_size()
            return t

        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ddpkit.barrier()
        times.append(time.perf_counter() - start)
    return kept, peak_memory_bytes(device) - before, statistics.median(times[1:] or times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--batch", type=int, default=512, help="samples per device per step")
    parser.add_argument("--steps", type=int, default=5, help="steps per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    args = parser.parse_args()
    names = list(CONFIGS)
    runs: dict[str, list[tuple[int, int, float]]] = {name: [] for name in names}
    for round_index in range(args.rounds):  # alternating the order: fair to drift
        for name in names if round_index % 2 == 0 else names[::-1]:
            runs[name].append(ddpkit.spawn(measure, args.workers, name, args)[0])
    results = {
        name: (found[-1][0], statistics.median(r[1] for r in found),
               statistics.median(r[2] for r in found))
        for name, found in runs.items()
    }  # fmt: skip
    params = sum(p.numel() for p in make_model(args.width, args.blocks).parameters())
    print(
        f"\n{args.workers} workers, {args.blocks} residual MLP blocks ({params / 1e6:.2f}M "
        f"parameters), batch {args.batch} per device, median of {args.rounds} x {args.steps} "
        "steps\n"
    )
    print("| configuration | kept for backward | peak rise over the steps | step time | vs off |")
    print("|---|---|---|---|---|")
    for name, (kept, rise, seconds) in results.items():
        base = results[name.removesuffix(" + recompute")][2]
        print(f"| {name} | {kept / 2**20:.1f} MiB | {rise / 2**20:.1f} MiB | "
              f"{seconds * 1e3:.1f} ms | {seconds / base:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
