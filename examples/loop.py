"""The wine classifier in a loop of your own, with ddpkit's guarantees kept: ``TrainLoop``.

No Trainer: the loop, the loss, the evaluation are plain PyTorch. ``TrainLoop`` is the
loop the Trainer runs, so a hand-written loop gets what the Trainer has: checkpoints that
resume mid-epoch to bit-identical parameters, the stop-request agreement (SIGTERM / SIGUSR1:
every rank checkpoints at the same step, exit 75), the NaN/inf check before each update,
gradient accumulation and mixed precision (``--accumulate``, ``--precision``), the hang
watchdog's step labels, the epoch line, and what ``ddpkit verify`` needs to follow the loop.
``gather_for_metrics`` collects every rank's predictions for a metric over the whole test
set, exactly as one process computes it; ``add_metrics`` puts it in the epoch's line.

    python examples/loop.py                                    # one process
    ddpkit run --nproc 2 examples/loop.py --checkpoint-dir runs/loop --save-every-steps 10
    ddpkit verify examples/loop.py --workers 2 --steps 10
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import ddpkit
from wine import load_data, make_model


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32, help="per device")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--checkpoint-dir", default=None, help="where checkpoints go (resumes)")
    parser.add_argument("--save-every-steps", type=int, default=None)
    parser.add_argument("--accumulate", type=int, default=1, help="batches per optimizer step")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def predict(model: nn.Module, loader: torch.utils.data.DataLoader) -> tuple[torch.Tensor, ...]:
    """This rank's predicted classes and labels over its shard of ``loader``, in order."""
    model.eval()
    predictions, labels = [], []
    with torch.no_grad():
        for x, y in loader:
            device = ddpkit.current_world().device
            predictions.append(model(x.to(device)).argmax(dim=1))
            labels.append(y.to(device))
    model.train()
    return torch.cat(predictions), torch.cat(labels)


def main() -> None:
    args = parse_args()
    ddpkit.init(seed=args.seed)
    train_set, test_set = load_data()
    model = ddpkit.prepare_model(make_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    train = ddpkit.prepare_loader(train_set, batch_size=args.batch_size)
    test = ddpkit.prepare_loader(test_set, batch_size=args.batch_size, shuffle=False)
    state = {"model": model, "optimizer": optimizer, "best_accuracy": 0.0}
    loop = ddpkit.TrainLoop(state, args.checkpoint_dir, save_every_steps=args.save_every_steps,
                            accumulate=args.accumulate, precision=args.precision)  # fmt: skip
    for _epoch in loop.epochs(args.epochs):
        for inputs, targets in loop.batches(train):  # on the device; resumes mid-epoch
            with loop.autocast():  # the precision asked for (fp32: nothing)
                loss = F.cross_entropy(model(inputs), targets)
            loop.backward(loss)  # loss.backward(), with the NaN/inf check and accumulation
            loop.optimizer_step(optimizer)  # the guard's verdict, step, zero_grad
        predicted, labels = ddpkit.gather_for_metrics(predict(model, test), test)
        accuracy = (predicted == labels).double().mean().item()
        state["best_accuracy"] = max(state["best_accuracy"], accuracy)  # checkpointed too
        loop.add_metrics({"test_accuracy": accuracy})  # shown in the epoch's line
    ddpkit.print0(f"best test accuracy {state['best_accuracy']:.4f}")


if __name__ == "__main__":
    main()
