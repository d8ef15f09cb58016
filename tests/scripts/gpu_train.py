"""Every training path only a GPU exercises, in one launch (the GPU tier's; run with ddpkit run).

    ddpkit run --nproc 1 tests/scripts/gpu_train.py OUT

both_faces.py's mixed case (accumulate=2, a NaN sample whose step is skipped, dropout under a
seed) through the Trainer and a hand-written TrainLoop, for DDP and FSDP, in bf16 and in fp16
with the gradient scaler; then the Trainer's bf16 DDP run again with ``compile=True``. Rank 0
writes OUT/<face>-<strategy>-<precision>.pt and OUT/compiled.pt (both_faces' results) and
OUT/facts.pt: the world's backend and device and NCCL's version.

One launch keeps the GPU window short: CUDA, NCCL and the process start once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from both_faces import train  # this script's folder is on sys.path: it is the script's own

import ddpkit

# fp16's kernels are CUDA's: GPU_TRAIN_PRECISIONS=bf16 rehearses the script on a CPU.
PRECISIONS = os.environ.get("GPU_TRAIN_PRECISIONS", "bf16,fp16").split(",")
RUNS = [
    (face, strategy, precision)
    for strategy in ("ddp", "fsdp")
    for precision in PRECISIONS
    for face in ("trainer", "loop")
]


def main() -> None:
    out = Path(sys.argv[1])
    world = ddpkit.init(seed=11)
    for face, strategy, precision in RUNS:
        result = train(face, "mixed", 3, None, strategy=strategy, precision=precision)
        if ddpkit.is_main():
            torch.save(result, out / f"{face}-{strategy}-{precision}.pt")
    compiled = train("trainer", "mixed", 3, None, compile=True)
    if ddpkit.is_main():
        torch.save(compiled, out / "compiled.pt")
        facts = {"backend": dist.get_backend(), "device": str(world.device),
                 "nccl": torch.cuda.is_available() and str(torch.cuda.nccl.version())}  # fmt: skip
        torch.save(facts, out / "facts.pt")


if __name__ == "__main__":
    main()
