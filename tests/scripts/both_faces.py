"""The same training through the Trainer or a hand-written TrainLoop: one engine, one result.

    ddpkit run --nproc 2 tests/scripts/both_faces.py FACE OUT [--case CASE] [--epochs N]
                                                          [--checkpoint-dir D]

FACE is ``trainer`` or ``loop``. Cases:

- ``mixed``: accumulate=2, bf16 autocast, nonfinite_loss="skip" with one sample's features
  NaN (the step whose batch holds it is skipped, every epoch, on whichever rank has it),
  dropout under a seed, checkpoints every 3 steps when a folder is given;
- ``uneven``: the user's own DataLoader, 5 batches on rank 0 and 10 on rank 1, with a
  checkpoint folder and checkpoints every 2 steps (torch's Join; no hang, no desync).

Rank 0 writes OUT/FACE-CASE.pt: the final parameters, the steps, the skipped steps, each
epoch's loss and sample count.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, Subset, TensorDataset

import ddpkit


def data(n: int = 40, bad_sample: int | None = None) -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    features = torch.randn(n, 6, generator=generator)
    if bad_sample is not None:
        features[bad_sample] = float("nan")  # a bad record: its batch's loss is NaN
    return TensorDataset(features, torch.randint(0, 3, (n,), generator=generator))


def setting(
    case: str, checkpoint_dir: str | None, precision: str = "bf16"
) -> tuple[Any, dict[str, Any], Any]:
    """The loader, the loop's options and the loss function of ``case``."""
    if case == "mixed":
        options = {"accumulate": 2, "precision": precision, "nonfinite_loss": "skip",
                   "save_every_steps": 3 if checkpoint_dir else None}  # fmt: skip
        return ddpkit.prepare_loader(data(bad_sample=7), batch_size=4), options, F.cross_entropy
    mine = range(0, 20) if ddpkit.get_rank() == 0 else range(20, 60)
    loader = DataLoader(Subset(data(60), mine), batch_size=4)  # no DistributedSampler
    return loader, {"save_every_steps": 2}, F.cross_entropy


def train(
    face: str, case: str, epochs: int, checkpoint_dir: str | None, **how: Any
) -> dict[str, Any]:
    """``how``: ``strategy``, ``compile`` (prepare_model's) and ``precision`` (the mixed case's;
    the GPU tier trains every one of them on CUDA)."""
    torch.manual_seed(0)
    model = ddpkit.prepare_model(
        nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3)),
        how.get("strategy", "ddp"),
        compile=how.get("compile", False),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader, options, loss_fn = setting(case, checkpoint_dir, how.get("precision", "bf16"))
    if face == "trainer":
        run: Any = ddpkit.Trainer(model, opt, loss_fn, checkpoint_dir, **options)
        run.fit(loader, epochs=epochs)
    else:
        run = ddpkit.TrainLoop({"model": model, "optimizer": opt}, checkpoint_dir, **options)
        for _epoch in run.epochs(epochs):
            for x, y in run.batches(loader):
                with run.autocast():
                    loss = loss_fn(model(x), y)
                run.backward(loss)
                run.optimizer_step()
    state = {  # FSDP's shards are gathered: every rank takes part
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
        for k, v in ddpkit.unwrap_model(model).state_dict().items()
    }
    return {"state": state, "steps": run.step, "skipped": run.skipped_steps,
            "device": str(next(model.parameters()).device), "history": run.history,
            "losses": [h["loss"] for h in run.history],
            "samples": [h["samples"] for h in run.history]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("face", choices=["trainer", "loop"])
    parser.add_argument("out")
    parser.add_argument("--case", choices=["mixed", "uneven", "all"], default="all")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--checkpoint-dir", default=None)
    args = parser.parse_args()
    ddpkit.init(seed=11)
    for case in ("mixed", "uneven") if args.case == "all" else (args.case,):
        folder = args.checkpoint_dir  # one folder per case when several run
        if folder and args.case == "all":
            folder = f"{folder}/{case}"
        result = train(args.face, case, args.epochs, folder)
        if ddpkit.is_main():
            torch.save(result, Path(args.out) / f"{args.face}-{case}.pt")


if __name__ == "__main__":
    main()
