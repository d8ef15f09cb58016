"""How a run is really set up, read from its model, optimizers and loader: the start-up line.

What changes with the world size and decides what a run computes: strategy, effective global
batch, learning rates, precision, the sampler's padding. The console says it once, checkpoints
record its batch facts (a resume at another world size says what became of the batch), and
``ddpkit bench`` / ``ddpkit verify`` read its record.

Example:
    >>> RunSetup(2, "ddp", 32, 64, "per_device", None, None, 0, 0.001, "fp32").global_batch
    64
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from torch.utils.data import DistributedSampler


class Stepping(Protocol):
    """How a run steps: every ``accumulate`` batches, in ``precision`` (the loop's options)."""

    @property
    def accumulate(self) -> int: ...

    @property
    def precision(self) -> str: ...


@dataclass(frozen=True)
class RunSetup:
    """How a run is really set up, read from its model, optimizers and loader.

    Example:
        >>> setup = RunSetup(2, "ddp", 32, 64, "per_device", None, None, 0, 0.001, "fp32")
        >>> setup.describe()
        'training DDP; global batch 64 = 32 per device x 2 ranks; lr 0.001; fp32'
    """

    world_size: int
    strategy: str
    per_device_batch: int | None
    global_batch: int | None
    batch_policy: str
    base_batch: int | None
    lr_scaling: str | None
    loader_workers: int | None
    lr: float
    precision: str
    accumulate: int = 1
    lrs: str = ""  # every optimizer's rates, when there is more to say than ``lr``
    padding: str | None = None  # what the sampler did to even out the shards
    layout: str = ""  # how the strategy arranged the ranks (HSDP: "2 replicas x 2 shards")

    @classmethod
    def of(
        cls, strategy: str, optimizers: Mapping[str, Any], loader: Any, world_size: int,
        stepping: Stepping, layout: str = "", policy_precision: str | None = None,
    ) -> RunSetup:  # fmt: skip
        """The set-up of a run of ``strategy`` and ``optimizers`` on ``loader`` (None: not
        known yet), stepping as ``stepping`` says (the loop's options).

        Example::

            RunSetup.of("ddp", {"optimizer": opt}, train_loader, 2, loop.options).global_batch
        """
        accumulate, precision = stepping.accumulate, stepping.precision
        if precision == "fp32" and policy_precision:  # FSDP's policy computes in it
            precision = policy_precision
        per_device = getattr(loader, "batch_size", None)
        plan = getattr(loader, "ddpkit_batch_plan", None)
        first = next(iter(optimizers.values())).param_groups[0]["lr"]
        return cls(
            world_size, strategy, per_device,
            per_device * world_size * accumulate if per_device else None,
            plan.policy if plan is not None else "per_device",
            plan.base_batch if plan is not None else None,
            plan.lr_scaling if plan is not None else None,
            getattr(loader, "num_workers", None), float(first), precision,
            accumulate, _lr_text(optimizers), _padding(loader), layout,
        )  # fmt: skip

    def record(self) -> dict[str, Any]:
        """The facts as plain values, for ``ddpkit bench`` and ``ddpkit verify``.

        Example::

            setup.record()["global_batch"]   # 64
        """
        return asdict(self)

    def describe(self) -> str:
        """The start-up line, ``training DDP; global batch 64 = ...; lr 0.001; fp32``."""
        name = self.strategy.upper() if self.strategy != "none" else "an unwrapped model"
        name += f" ({self.layout})" if self.layout else ""
        batch = _batch_text(self.per_device_batch, self.world_size, self.accumulate)
        if self.batch_policy != "per_device":
            batch += f" (batch_policy={self.batch_policy})"
        parts = [f"training {name}", batch, self.lrs or f"lr {self.lr:g}", self.precision]
        return "; ".join(parts + ([self.padding] if self.padding else []))

    def batch_facts(self) -> dict[str, Any]:
        """What a checkpoint records of the batch, to compare after a resume elsewhere."""
        return {"world_size": self.world_size, "global_batch": self.global_batch}

    def change_from(self, saved: Mapping[str, Any] | None) -> str | None:
        """A line when a resume changed the world size: whether the global batch was kept.

        Example:
            >>> setup = RunSetup(1, "ddp", 12, 12, "global", 12, None, 0, 0.1, "fp32")
            >>> setup.change_from({"world_size": 2, "global_batch": 12})
            'world size 2 -> 1: global batch 12 kept (12 per device x 1 rank)'
        """
        if not saved or saved.get("world_size") in (None, self.world_size):
            return None
        head = f"world size {saved['world_size']} -> {self.world_size}: "
        now = _batch_text(self.per_device_batch, self.world_size, self.accumulate)
        before = saved.get("global_batch")
        if before == self.global_batch:
            return head + now.replace(" = ", " kept (", 1) + ")"
        return head + (
            f"global batch {before} -> {self.global_batch} ({now.split(' = ')[-1]}; "
            f"batch_policy={self.batch_policy!r} keeps the batch per device); to keep the "
            "global batch, and with it the learning rate's meaning, pass "
            "batch_policy='global' to prepare_loader"
        )


def _batch_text(per_device: int | None, world_size: int, accumulate: int) -> str:
    if per_device is None:
        return "batch size unknown (the loader has no batch_size)"
    factors = [f"{per_device} per device", f"{world_size} rank{'s' if world_size > 1 else ''}"]
    if accumulate > 1:
        factors.append(f"{accumulate} micro-steps")
    return f"global batch {per_device * world_size * accumulate} = {' x '.join(factors)}"


def _lr_text(optimizers: Mapping[str, Any]) -> str:
    """``lr 0.001`` (several groups: ``lr 0.001/0.01``); by name with several optimizers."""
    texts = {}
    for name, optimizer in optimizers.items():
        rates = sorted({group["lr"] for group in optimizer.param_groups})
        texts[name] = "/".join(f"{float(rate):g}" for rate in rates)
    if len(texts) == 1:
        return f"lr {next(iter(texts.values()))}"
    return "lr " + ", ".join(f"{rate} ({name})" for name, rate in texts.items())


def _padding(loader: Any) -> str | None:
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
