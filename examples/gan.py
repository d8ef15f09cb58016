"""A GAN under ddpkit: two models, two optimizers, two schedulers, a step of its own.

The classic toy: a generator learns to place points on 8 Gaussian modes around a ring, a
discriminator learns to tell its points from real ones. Both are DDP models; each training
step makes two updates (the discriminator's, then the generator's) with
``trainer.backward`` and ``trainer.optimizer_step``, which check each loss for NaN/inf and
keep the hang watchdog's labels. Checkpoints hold both models, both optimizers and both
schedulers, and resume bit-identically.

The latent noise comes with the data (each sample carries its own ``z``, drawn once from a
seeded generator) rather than from ``torch.randn`` inside the step: a rank's random stream
would give N workers different noise than one process, whereas noise that belongs to a
sample is the same however the samples are split. That is what lets ``ddpkit verify`` prove
N workers equal one process here.

    python examples/gan.py --epochs 100                   # one process
    ddpkit run --nproc 2 examples/gan.py --epochs 100     # two workers
    ddpkit verify examples/gan.py --workers 2 --steps 10
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import ddpkit

LATENT = 8
MODES = torch.tensor(
    [[math.cos(2 * math.pi * k / 8), math.sin(2 * math.pi * k / 8)] for k in range(8)]
)


def ring_data(count: int, seed: int) -> TensorDataset:
    """``count`` real points (a mode plus noise 0.05) and a latent vector for each."""
    generator = torch.Generator().manual_seed(seed)
    modes = MODES[torch.randint(0, 8, (count,), generator=generator)]
    real = modes + 0.05 * torch.randn(count, 2, generator=generator)
    return TensorDataset(real, torch.randn(count, LATENT, generator=generator))


def generator_net() -> nn.Module:
    return nn.Sequential(
        nn.Linear(LATENT, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2)
    )


def discriminator_net() -> nn.Module:
    return nn.Sequential(
        nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1)
    )


class GANTrainer(ddpkit.Trainer):
    """Two updates per batch; the epoch line shows both losses and the distance to a mode."""

    def training_step(self, batch: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        real, z = batch
        gen, disc = self.models["generator"], self.models["discriminator"]
        opt_g, opt_d = self.optimizers["generator"], self.optimizers["discriminator"]
        fake = gen(z)
        # The discriminator sees real and fake points in one forward pass: under DDP each
        # forward must be followed by its own backward.
        logits = disc(torch.cat([real, fake.detach()]))
        labels = torch.cat([torch.ones(len(real), 1), torch.zeros(len(fake), 1)])
        loss_d = F.binary_cross_entropy_with_logits(logits, labels.to(logits.device))
        self.backward(loss_d)
        self.optimizer_step(opt_d)
        # The generator wants its points called real.
        called = disc(fake)
        loss_g = F.binary_cross_entropy_with_logits(called, torch.ones_like(called))
        self.backward(loss_g)
        self.optimizer_step(opt_g)
        opt_d.zero_grad(set_to_none=True)  # loss_g's gradients reached the discriminator too
        return {"loss_d": loss_d, "loss_g": loss_g}

    def validation_step(self, batch: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        _, z = batch
        points = self.models["generator"](z)
        nearest = torch.cdist(points, MODES.to(points.device)).min(dim=1).values
        return {"mode_distance": nearest.mean()}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64, help="points per device")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--checkpoint-dir", default=None, help="where checkpoints go (resumes)")
    parser.add_argument("--save-every-steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    ddpkit.init(seed=args.seed)
    models = {
        "generator": ddpkit.prepare_model(generator_net()),
        "discriminator": ddpkit.prepare_model(discriminator_net()),
    }
    optimizers = {
        name: torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.5, 0.999))
        for name, model in models.items()
    }
    schedulers = {
        name: torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.999)
        for name, opt in optimizers.items()
    }
    trainer = GANTrainer(
        models,
        optimizers,
        scheduler=schedulers,
        manual_optimization=True,  # the step makes both updates itself
        checkpoint_dir=args.checkpoint_dir,
        save_every_steps=args.save_every_steps,
    )
    train = ddpkit.prepare_loader(ring_data(2048, seed=1), batch_size=args.batch_size)
    val = ddpkit.prepare_loader(ring_data(512, seed=2), batch_size=args.batch_size, shuffle=False)
    trainer.fit(train, epochs=args.epochs, val=val)
    result = trainer.evaluate(val)
    ddpkit.print0(f"generated points lie {result['mode_distance']:.3f} from the nearest mode "
                  f"on average ({ddpkit.current_world().world_size} workers)")  # fmt: skip


if __name__ == "__main__":
    main()
