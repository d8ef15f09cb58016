"""Starting a sharded model on the meta device vs building it whole on every rank: each
rank's peak memory, against its share of the model.

The model (residual MLP blocks, ~100M parameters by default) is saved once as a
.safetensors file. Then, in fresh workers for each way and round (alternating), every rank
prepares it for FSDP from that file: either built whole first (random init, broadcast,
sharded, then the file's values loaded), or built on the meta device (no memory), sharded
while empty, and each rank reading only its rows of each tensor. Reported per way: the
largest rank's rise of peak memory (resident set on CPU, CUDA's max allocated on a GPU)
from just before the model is built to just after it is ready, as a multiple of one rank's
share of the parameters (the model's bytes / N). Memory is exact; no time is compared.

    .venv/bin/python benchmarks/meta_start.py                  # 2 workers, ~100M parameters
    .venv/bin/python benchmarks/meta_start.py --workers 4 --blocks 4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

import ddpkit
from ddpkit.runtime.memory import peak_memory_bytes, reset_peak_memory


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def make_model(width: int, blocks: int) -> nn.Module:
    return nn.Sequential(*(Block(width) for _ in range(blocks)))


def prepare(way: str, width: int, blocks: int, weights: str) -> int:
    """In a fresh worker: the rise of this rank's peak memory while the model is prepared."""
    device = ddpkit.init(timeout=600).device
    reset_peak_memory(device)
    before = peak_memory_bytes(device)
    if way == "meta":
        with torch.device("meta"):
            model = make_model(width, blocks)
    else:
        model = make_model(width, blocks)
    ddpkit.prepare_model(model, ddpkit.FSDPStrategy(units=(Block,)), weights=weights)
    return peak_memory_bytes(device) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = make_model(args.width, args.blocks)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    share = model_bytes / args.workers
    with tempfile.TemporaryDirectory() as scratch:
        weights = str(Path(scratch) / "model.safetensors")
        save_file(model.state_dict(), weights)
        del model
        rises: dict[str, list[int]] = {"whole": [], "meta": []}
        for round_index in range(args.rounds):
            for way in ("whole", "meta") if round_index % 2 == 0 else ("meta", "whole"):
                per_rank = ddpkit.spawn(
                    prepare, args.workers, way, args.width, args.blocks, weights
                )
                rises[way].append(max(per_rank))
    print(
        f"\n{args.workers} workers, FSDP, {model_bytes / 2**20:.0f} MiB of parameters "
        f"({share / 2**20:.0f} MiB per rank's share), median of {args.rounds} rounds\n"
    )
    print("| start | largest rank's peak rise | x its share |")
    print("|---|---|---|")
    for way, found in rises.items():
        rise = statistics.median(found)
        label = "built whole on every rank" if way == "whole" else "meta device + weights file"
        print(f"| {label} | {rise / 2**20:.0f} MiB | {rise / share:.2f} |")


if __name__ == "__main__":
    main()
