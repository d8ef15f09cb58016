"""GPU parity: ddpkit's Trainer against a hand-written DDP loop on a GPT-2-sized model.

Both sides train examples/gpt.py's GPT at GPT-2 small's shape (12 layers, 12 heads, 768 wide,
1024 tokens of context; a byte vocabulary, so 85M parameters) with AdamW under bf16 autocast,
on the same random bytes and batch, one worker per GPU under ``ddpkit run`` (NCCL):

- ``raw``: the tutorials' loop: init_process_group, DDP, DistributedSampler, set_epoch,
  batches moved to the GPU, autocast, backward, step;
- ``ddpkit``: init, prepare_model, prepare_loader, the example's LMTrainer with
  ``precision="bf16"``, default settings otherwise.

A step's time is the time between two epochs' ends (the GPU synchronised at each) over the
epoch's steps, so whatever either side does per epoch counts; the first epoch is warm-up. Runs
alternate, each a fresh launch; the medians of ``--repeat`` runs are printed with their ratio,
and each side's peak GPU memory per rank (``torch.cuda.max_memory_allocated``).

    PYTHONPATH=src python3 benchmarks/gpu_parity.py              # one GPU: about 2 minutes
    PYTHONPATH=src python3 benchmarks/gpu_parity.py --tiny       # wiring only, on a CPU too
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import ddpkit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
from gpt import GPT, ByteWindows, GPTConfig, LMTrainer  # noqa: E402  (an example, not a package)

GPT2_SMALL = {"block_size": 1024, "n_layer": 12, "n_head": 12, "n_embd": 768}
TINY = {"block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32}


def setup(cfg: dict[str, Any]) -> tuple[GPTConfig, ByteWindows]:
    """The model's shape and the same random bytes on every side and rank."""
    config = GPTConfig(**cfg["shape"])
    windows = cfg["steps"] * cfg["batch"] * cfg["workers"]
    generator = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (windows * config.block_size + 1,), generator=generator)
    return config, ByteWindows(data.to(torch.uint8), config.block_size)


def synchronize(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def raw_worker(cfg: dict[str, Any]) -> dict[str, float]:
    """The tutorials' DDP loop, torchrun-style (the launcher's environment)."""
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    config, dataset = setup(cfg)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        GPT(config).to(device), device_ids=[local_rank] if cuda else None
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, cfg["batch"], sampler=sampler, pin_memory=cuda)
    ends = [synchronize(device)]
    for epoch in range(cfg["epochs"]):
        sampler.set_epoch(epoch)
        for batch in loader:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(**batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        ends.append(synchronize(device))
    # DDP first, then the group: a reducer holding the group's last reference makes torch
    # 2.13 destroy the gloo group under the GIL, which can abort the process as it exits
    # ("terminate called without an active exception": seen once in this dry run on a CPU).
    # DDP sits in reference cycles, so collect them, as ddpkit.shutdown() does.
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()
    return measured(ends, len(loader), device)


class EpochEnds(ddpkit.Callback):
    """When each epoch ended, the GPU synchronised first."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.ends = device, [synchronize(device)]

    def on_train_epoch_end(self, trainer: ddpkit.Trainer, metrics: dict[str, float]) -> None:
        self.ends.append(synchronize(self.device))


def ddpkit_worker(cfg: dict[str, Any]) -> dict[str, float]:
    """The same job through ddpkit's public API, with the example's Trainer."""
    world = ddpkit.init(seed=0)
    config, dataset = setup(cfg)
    model = ddpkit.prepare_model(GPT(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    loader = ddpkit.prepare_loader(dataset, cfg["batch"])
    ends = EpochEnds(world.device)
    LMTrainer(model, optimizer, precision="bf16", callbacks=[ends]).fit(loader, cfg["epochs"])
    ddpkit.shutdown()
    return measured(ends.ends, len(loader), world.device)


def measured(ends: list[float], steps: int, device: torch.device) -> dict[str, float]:
    """Median step time after the warm-up epoch, and this rank's peak memory."""
    per_step = [(b - a) / steps for a, b in itertools.pairwise(ends[1:])]
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return {"step_s": statistics.median(per_step), "peak_mib": peak / 2**20}


def launch(side: str, cfg: dict[str, Any]) -> dict[str, float]:
    """One fresh ``ddpkit run`` of ``side``; rank 0's measurement."""
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "result.json"
        command = [sys.executable, "-m", "ddpkit", "run", "--nproc", str(cfg["workers"]),
                   __file__, "--worker", side, "--config", json.dumps(cfg),
                   "--result", str(result)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=cfg["timeout"])
        if done.returncode != 0:
            raise SystemExit(f"gpu_parity: the {side} run failed:\n{done.stdout}{done.stderr}")
        measurement: dict[str, float] = json.loads(result.read_text())
        return measurement


def compare(cfg: dict[str, Any], repeat: int) -> dict[str, Any]:
    """Both sides ``repeat`` times, alternating; the medians and their ratio."""
    runs: dict[str, list[dict[str, float]]] = {"raw": [], "ddpkit": []}
    for round_ in range(1, repeat + 1):
        for side in runs:
            started = time.perf_counter()
            runs[side].append(launch(side, cfg))
            # as it goes: a run cut short by its time limit still shows how far it got
            took, step_ms = time.perf_counter() - started, runs[side][-1]["step_s"] * 1000
            print(f"gpu_parity: {side} run {round_}/{repeat}: {step_ms:.1f} ms/step, "
                  f"{took:.1f} s from launch to exit", flush=True)  # fmt: skip
    step = {s: statistics.median(r["step_s"] for r in got) for s, got in runs.items()}
    peak = {s: max(r["peak_mib"] for r in got) for s, got in runs.items()}
    return {"step_ms": {s: v * 1000 for s, v in step.items()}, "peak_mib": peak,
            "ratio": step["ddpkit"] / step["raw"], "runs": runs}  # fmt: skip


def report(cfg: dict[str, Any], result: dict[str, Any]) -> str:
    gpus = cfg["workers"]
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    params = sum(p.numel() for p in GPT(GPTConfig(**cfg["shape"])).parameters()) / 1e6
    step, peak = result["step_ms"], result["peak_mib"]
    return "\n".join([
        f"gpu_parity: GPT {params:.1f}M parameters, batch {cfg['batch']} x "
        f"{cfg['shape']['block_size']} tokens per rank, bf16, {gpus} worker(s) on {device}; "
        f"median of {cfg['repeat']} runs of {cfg['steps']} steps per epoch",
        f"  raw DDP loop   {step['raw']:8.1f} ms/step   peak {peak['raw']:8.0f} MiB per rank",
        f"  ddpkit Trainer {step['ddpkit']:8.1f} ms/step   peak {peak['ddpkit']:8.0f} MiB per rank",
        f"  ratio ddpkit/raw {result['ratio']:.3f}",
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=max(1, torch.cuda.device_count()))
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=3, help="the first is warm-up")
    parser.add_argument("--repeat", type=int, default=3, help="runs per side (median)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run")
    parser.add_argument("--tiny", action="store_true", help="a tiny model: wiring only")
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument("--worker", choices=["raw", "ddpkit"], help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args)
        return
    cfg = {"shape": TINY if args.tiny else GPT2_SMALL, "workers": args.workers,
           "batch": 2 if args.tiny else args.batch, "steps": 3 if args.tiny else args.steps,
           "epochs": args.epochs, "repeat": 1 if args.tiny else args.repeat,
           "timeout": args.timeout}  # fmt: skip
    result = compare(cfg, cfg["repeat"])
    print(report(cfg, result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"config": cfg, **result}, indent=1))


def run_worker(args: argparse.Namespace) -> None:
    cfg = json.loads(args.config)
    measurement = (raw_worker if args.worker == "raw" else ddpkit_worker)(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        Path(args.result).write_text(json.dumps(measurement))


if __name__ == "__main__":
    main()
