"""The worker of ``ddpkit doctor --smoke``: an all_reduce checked for correctness, then timed.

Launched as ``ddpkit run --nproc N smoke.py``: every rank joins with ``ddpkit.init()``, checks
that an all_reduce of the ranks gives 0 + 1 + ... + (N-1), then times all_reduce over a few
sizes. Bandwidths follow nccl-tests' definitions: algorithm bandwidth = bytes / time, bus
bandwidth = algbw x 2(n-1)/n (what each link carries in a ring, comparable across world
sizes). Rank 0 writes the results as JSON to the path in ``DDPKIT_SMOKE_OUT``.

Example:
    >>> bus_bandwidth(algbw=10.0, world_size=4)
    15.0
    >>> size_text(16 * 2**20)
    '16 MiB'
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddpkit._core.protocol import SMOKE_OUT_ENV

CPU_SIZES = (4 * 2**10, 64 * 2**10, 2**20, 16 * 2**20)
GPU_SIZES = (2**20, 16 * 2**20, 256 * 2**20, 2**30)
WARMUP_ITERS = 5
SMALL_TIMED_ITERS = 20  # below 1 MiB one call is too short to time alone
LARGE_TIMED_ITERS = 5


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of an all_reduce: algbw x 2(n-1)/n.

    Example:
        >>> bus_bandwidth(3.0, 2)
        3.0
    """
    return algbw * 2 * (world_size - 1) / world_size


def size_text(nbytes: int) -> str:
    """A byte count as "4 KiB", "16 MiB", "1 GiB".

    Example:
        >>> size_text(4096), size_text(2**30)
        ('4 KiB', '1 GiB')
    """
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def check_sum(rank: int, world_size: int, device: torch.device) -> float:
    """All-reduce the ranks; raise with the numbers unless the sum is 0 + 1 + ... + (n-1).

    Example::

        check_sum(rank, world_size, device)   # 1.0
    """
    tensor = torch.tensor([float(rank)], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    expected = world_size * (world_size - 1) / 2
    if tensor.item() != expected:
        raise RuntimeError(
            f"rank {rank}: all_reduce of the ranks gave {tensor.item()}, expected {expected} "
            f"(0 + 1 + ... + {world_size - 1}); the backend or the network corrupts data"
        )
    return float(tensor.item())


def time_all_reduce(nbytes: int, device: torch.device, world_size: int) -> dict[str, float]:
    """Seconds per all_reduce of ``nbytes`` (the slowest rank's), with both bandwidths in GB/s.

    Example::

        time_all_reduce(4096, torch.device("cpu"), 2)
        # {'bytes': 4096, 'time_ms': 0.2, 'algbw_gbps': 0.02, 'busbw_gbps': 0.02}
    """
    # Zeros stay zeros however often they are summed: no overflow to inf on large worlds.
    tensor = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    for _ in range(WARMUP_ITERS):
        dist.all_reduce(tensor)
    _synchronize(device)
    iterations = SMALL_TIMED_ITERS if nbytes < 2**20 else LARGE_TIMED_ITERS
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(tensor)
    _synchronize(device)
    # A collective finishes when its slowest rank does: report that rank's time.
    seconds = torch.tensor([(time.perf_counter() - start) / iterations], device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    algbw = nbytes / seconds.item() / 1e9
    return {
        "bytes": nbytes,
        "time_ms": seconds.item() * 1000,
        "algbw_gbps": algbw,
        "busbw_gbps": bus_bandwidth(algbw, world_size),
    }


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_smoke() -> dict[str, Any]:
    """Join the job, check the sum, time every size; the results as plain values.

    Example::

        run_smoke()["correct"]   # True
    """
    import ddpkit

    world = ddpkit.init()
    if not dist.is_initialized():
        raise SystemExit("smoke.py needs a launcher: ddpkit run --nproc 2 smoke.py")
    total = check_sum(world.rank, world.world_size, world.device)
    sizes = GPU_SIZES if world.device.type == "cuda" else CPU_SIZES
    return {
        "world_size": world.world_size,
        "backend": world.backend,
        "device": world.device.type,
        "correct": True,
        "sum": total,
        "results": [time_all_reduce(n, world.device, world.world_size) for n in sizes],
        "is_main": world.is_main,
    }


def main() -> None:
    """Run the smoke test; rank 0 writes the JSON results where DDPKIT_SMOKE_OUT says."""
    import ddpkit

    try:
        results = run_smoke()
    finally:
        ddpkit.shutdown()
    if not results.pop("is_main"):
        return
    target = os.environ.get(SMOKE_OUT_ENV)
    if target:
        Path(target).write_text(json.dumps(results), encoding="utf-8")
    else:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
