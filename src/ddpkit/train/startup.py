"""The one line the Trainer prints when training starts: how the run is really set up.

The effective global batch size and the learning rate in use decide what a run computes, and
both change with the world size, so they are stated rather than left for the user to infer
(the tutorials' batch-size advice). The numbers are read from the live objects (the loader's
batch size, the optimizer's LR, the sampler's padding), not from what was asked for.

Example::

    _uneven_note(loader)
    # '1 sample repeated so the 2 shards are equal (uneven="pad")'
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DistributedSampler

from ddpkit.parallel.strategy import strategy_of
from ddpkit.train.state import TrainingRun


def describe_training(trainer: TrainingRun, loader: Any) -> str:
    """``training ...`` with strategy, global batch, LR, precision and padding (logged as
    ``ddpkit: training ...``).

    Example::

        describe_training(trainer, train_loader)
        # 'training DDP; global batch 64 = 32 per device x 2 ranks; lr 0.001; fp32'
    """
    world_size = trainer.world.world_size
    name = strategy_of(trainer.model).name
    parts = [f"training {name.upper() if name != 'none' else 'an unwrapped model'}"]
    parts.append(_batch_text(getattr(loader, "batch_size", None), world_size, trainer.accumulate))
    plan = getattr(loader, "ddpkit_batch_plan", None)
    if plan is not None and plan.policy != "per_device":
        parts[-1] += f" (batch_policy={plan.policy})"
    parts.append(_lr_text(trainer.optimizer))
    parts.append(trainer.precision.precision)
    note = _uneven_note(loader)
    return "; ".join(parts + ([note] if note else []))


def setup_record(trainer: TrainingRun, loader: Any) -> dict[str, Any]:
    """The run's set-up as plain values, for ``ddpkit bench`` (see :mod:`ddpkit.runtime.reporting`).

    Example::

        setup_record(trainer, train_loader)["global_batch"]   # 64
    """
    world_size = trainer.world.world_size
    per_device = getattr(loader, "batch_size", None)
    plan = getattr(loader, "ddpkit_batch_plan", None)
    return {
        "world_size": world_size,
        "strategy": strategy_of(trainer.model).name,
        "per_device_batch": per_device,
        "global_batch": per_device * world_size * trainer.accumulate if per_device else None,
        "batch_policy": plan.policy if plan is not None else "per_device",
        "base_batch": plan.base_batch if plan is not None else None,
        "lr_scaling": plan.lr_scaling if plan is not None else None,
        "loader_workers": getattr(loader, "num_workers", None),
        "lr": float(trainer.optimizer.param_groups[0]["lr"]),
        "precision": trainer.precision.precision,
    }


def _batch_text(per_device: int | None, world_size: int, accumulate: int) -> str:
    if per_device is None:
        return "batch size unknown (the loader has no batch_size)"
    factors = [f"{per_device} per device", f"{world_size} rank{'s' if world_size > 1 else ''}"]
    if accumulate > 1:
        factors.append(f"{accumulate} micro-steps")
    return f"global batch {per_device * world_size * accumulate} = {' x '.join(factors)}"


def _lr_text(optimizer: Any) -> str:
    rates = sorted({group["lr"] for group in optimizer.param_groups})
    return "lr " + "/".join(f"{float(rate):g}" for rate in rates)


def _uneven_note(loader: Any) -> str | None:
    sampler = getattr(loader, "sampler", None)
    if not isinstance(sampler, DistributedSampler):
        return None
    n, shards = len(sampler.dataset), sampler.num_replicas  # type: ignore[arg-type]
    extra = sampler.total_size - n
    if extra == 0:
        return None
    count = f"{abs(extra)} sample{'s' if abs(extra) > 1 else ''}"
    if extra > 0:
        return f'{count} repeated so the {shards} shards are equal (uneven="pad")'
    return f'{count} left out so the {shards} shards are equal (uneven="drop")'
