"""The tutorial's wine classifier, data-parallel with ddpkit.

sklearn's wine data (178 samples, 13 features, 3 classes), 80/20 split with random_state=42,
StandardScaler fitted on the train split, an MLP 13 -> 64 -> 3, Adam (lr 1e-3), cross-entropy,
32 samples per device per step.

    python examples/wine.py --epochs 100                    # one process
    ddpkit run --nproc 2 examples/wine.py --epochs 100      # two workers, DDP over gloo
    ddpkit run --nproc 2 examples/wine.py --strategy fsdp --precision bf16
    ddpkit run --nproc 4 examples/wine.py --strategy hsdp --hsdp-shard-size 2   # a 2x2 mesh
    ddpkit run --nproc 2 examples/wine.py --batch-policy global --batch-size 64
    ddpkit run --nproc 2 --max-restarts 3 examples/wine.py --checkpoint-dir runs/wine \
        --save-every-steps 50                                # survives a worker's crash
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from sklearn.datasets import load_wine
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.utils.data import TensorDataset

import ddpkit


def load_data() -> tuple[TensorDataset, TensorDataset]:
    """Train and test splits as float32 feature / int64 label tensors."""
    features, labels = load_wine(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        features, labels, test_size=0.2, random_state=42
    )
    scaler = StandardScaler().fit(x_train)  # fitted on train only: no test leakage
    return _tensors(scaler.transform(x_train), y_train), _tensors(scaler.transform(x_test), y_test)


def _tensors(x, y) -> TensorDataset:
    return TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long))


class WineNet(nn.Module):
    """13 measurements -> 3 cultivars. A class of its own rather than an nn.Sequential, so
    that --compile compiles it under DDP too (torch skips a bare torch.nn container there)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def make_model() -> nn.Module:
    return WineNet()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32, help="see --batch-policy")
    parser.add_argument(
        "--batch-policy",
        choices=["per_device", "global"],
        default="per_device",
        help="per_device: each rank takes --batch-size; global: --batch-size split over ranks",
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="for --batch-size in one process")
    parser.add_argument("--lr-scaling", choices=["none", "linear", "sqrt"], default="none")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-steps per step")
    parser.add_argument("--strategy", choices=["ddp", "fsdp", "hsdp", "dp", "none"], default="ddp")
    parser.add_argument(
        "--hsdp-shard-size",
        type=int,
        default=None,
        help="hsdp: ranks per replica (default: per node)",
    )
    parser.add_argument("--comm-hook", choices=["fp16", "bf16", "powersgd"], default=None)
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--save-every", type=int, default=None, help="checkpoint every N epochs")
    parser.add_argument(
        "--save-every-steps", type=int, default=None, help="checkpoint every N optimizer steps"
    )
    parser.add_argument("--checkpoint-dir", default=None, help="where checkpoints go (resumes)")
    parser.add_argument("--log-dir", default=None, help="TensorBoard event files and a CSV")
    parser.add_argument(
        "--loggers",
        nargs="*",
        choices=["mlflow", "wandb"],
        default=[],
        help="experiment trackers too (MLFLOW_TRACKING_URI, WANDB_MODE, ... configure them)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for flag, owner in (("comm_hook", "ddp"), ("hsdp_shard_size", "hsdp")):
        if getattr(args, flag) and args.strategy != owner:
            parser.error(f"--{flag.replace('_', '-')} is for --strategy {owner}")
    return args


def strategy(args: argparse.Namespace) -> object:
    """--strategy by name, or as its object with the options given for it."""
    if args.strategy == "ddp" and args.comm_hook:
        return ddpkit.DDPStrategy(comm_hook=args.comm_hook)
    if args.strategy == "hsdp" and args.hsdp_shard_size:
        return ddpkit.HSDPStrategy(shard_size=args.hsdp_shard_size)
    return args.strategy


def trackers(args: argparse.Namespace) -> list[ddpkit.Tracker]:
    """One run per job in each tracker asked for, with this command line's settings."""
    kinds = {"mlflow": ddpkit.MLflowLogger, "wandb": ddpkit.WandbLogger}
    return [kinds[name](params=vars(args)) for name in args.loggers]


def main() -> None:
    args = parse_args()
    ddpkit.init(seed=args.seed)  # the same model on every rank; DDP/FSDP broadcast it too
    train_set, test_set = load_data()
    model = ddpkit.prepare_model(make_model(), strategy(args), compile=args.compile)
    plan = ddpkit.plan_batch(
        args.batch_size,
        args.batch_policy,
        accumulate=args.accumulate,
        lr=args.lr,
        lr_scaling=args.lr_scaling,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=plan.lr)
    trainer = ddpkit.Trainer(
        model,
        optimizer,
        loss_fn=F.cross_entropy,
        checkpoint_dir=args.checkpoint_dir,
        save_every=args.save_every,
        save_every_steps=args.save_every_steps,
        accumulate=args.accumulate,
        precision=args.precision,
        log_dir=args.log_dir,
        loggers=trackers(args),
    )
    train = ddpkit.prepare_loader(train_set, plan, shuffle=True)
    test = ddpkit.prepare_loader(test_set, plan, shuffle=False)
    trainer.fit(train, epochs=args.epochs, val=test)  # val_accuracy per epoch, exact
    result = trainer.evaluate(test)
    ddpkit.print0(
        f"test accuracy {result['accuracy']:.4f}  test loss {result['loss']:.4f}  "
        f"({len(test_set)} samples, {ddpkit.current_world().world_size} workers)"
    )


if __name__ == "__main__":
    main()
