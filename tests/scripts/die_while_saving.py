"""Train 3 epochs with a checkpoint each; with --die-on-save N, rank 0 SIGKILLs itself during
its N-th checkpoint write: after the file is written and fsynced, before it is renamed."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (helpers.mp_workers)

import ddpkit
from helpers.mp_workers import toy_dataset, toy_model


def die_on_checkpoint_rename(count: int) -> None:
    real_replace, seen = os.replace, []

    def replace(src: str, dst: str) -> None:
        if Path(dst).name.startswith("epoch_"):
            seen.append(dst)
            if len(seen) == count:
                os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)

    os.replace = replace  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--die-on-save", type=int, default=None)
    args = parser.parse_args()
    ddpkit.init(seed=0)
    if args.die_on_save and ddpkit.is_main():
        die_on_checkpoint_rename(args.die_on_save)
    model = ddpkit.prepare_model(toy_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    trainer = ddpkit.Trainer(model, optimizer, F.cross_entropy, args.folder, save_every=1)
    trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=4), epochs=3)


if __name__ == "__main__":
    main()
