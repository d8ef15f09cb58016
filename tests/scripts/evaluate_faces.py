"""Evaluation through both faces on a dataset the sampler pads (run with ddpkit run, or alone).

    evaluate_faces.py OUT.pt

37 samples: 2 ranks get 19 each, one sample repeated. Rank 0 writes what ``TrainLoop.evaluate``
and ``Trainer.evaluate`` return for the same model and step, and whether the model was back in
training mode afterwards.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import ddpkit


def step(model: torch.nn.Module) -> Callable[[Any], dict[str, torch.Tensor]]:
    def metrics(batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        logits = model(batch[0])
        correct = (logits.argmax(1) == batch[1]).float().mean()
        return {"loss": F.cross_entropy(logits, batch[1]), "accuracy": correct}

    return metrics


def main() -> None:
    ddpkit.init(seed=3)
    generator = torch.Generator().manual_seed(5)
    data = torch.utils.data.TensorDataset(
        torch.randn(37, 6, generator=generator), torch.randint(0, 3, (37,), generator=generator)
    )
    model = ddpkit.prepare_model(torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.5),
                                                     torch.nn.Linear(8, 3)))  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    val = ddpkit.prepare_loader(data, batch_size=4, shuffle=False)
    loop = ddpkit.TrainLoop({"model": model, "optimizer": opt})
    model.train()
    by_loop = loop.evaluate(val, step(model))
    training_after = model.training
    trainer = ddpkit.Trainer(model, opt, validation_step=step(model), training_step=step(model))
    by_trainer = trainer.evaluate(val)
    if ddpkit.is_main():
        torch.save({"loop": by_loop, "trainer": by_trainer, "training_after": training_after},
                   sys.argv[1])  # fmt: skip
    ddpkit.shutdown()


if __name__ == "__main__":
    main()
