"""What a run shows as it goes: the start-up line, tqdm's bar, a line every N steps, epoch lines.

The start-up line states what changes with the world size and decides what a run computes:
strategy, effective global batch, learning rates, precision, the sampler's padding, read from
the live objects (:class:`RunSetup`). Rank 0's bar shows the latest step's metrics on a
terminal (under ``ddpkit run``: when its console is one); elsewhere (CI logs, pipes) a line
every ``log_every`` steps helps instead. Every line is a record of the ``ddpkit`` logger
from rank 0, so ``logging.getLogger("ddpkit").setLevel(logging.WARNING)`` silences them all.

Example:
    >>> format_epoch({"epoch": 1.0, "loss": 0.5, "samples": 8.0, "time_s": 1.25}, 10)
    'epoch 1/10  loss 0.5000  (1.25 s)'
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from torch.utils.data import DistributedSampler
from tqdm import tqdm

from ddpkit._core.log import PLAIN, logger
from ddpkit._core.protocol import LIVE_CONSOLE_ENV
from ddpkit.runtime.collectives import is_main
from ddpkit.train.options import LoopOptions
from ddpkit.train.ranktimes import RankTimes
from ddpkit.train.state import RunState


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

    @classmethod
    def of(cls, run: RunState, options: LoopOptions, loader: Any, world_size: int) -> RunSetup:
        """The set-up of ``run`` training on ``loader`` (None: not known yet).

        Example::

            RunSetup.of(run, LoopOptions(), train_loader, world_size=2).global_batch   # 64
        """
        per_device = getattr(loader, "batch_size", None)
        plan = getattr(loader, "ddpkit_batch_plan", None)
        first = next(iter(run.optimizers.values())).param_groups[0]["lr"]
        return cls(
            world_size, run.strategy.name, per_device,
            per_device * world_size * options.accumulate if per_device else None,
            plan.policy if plan is not None else "per_device",
            plan.base_batch if plan is not None else None,
            plan.lr_scaling if plan is not None else None,
            getattr(loader, "num_workers", None), float(first), options.precision,
            options.accumulate, _lr_text(run.optimizers), _padding(loader),
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


class Console:
    """Rank 0's lines and bar for one run.

    Example:
        >>> Console(log_every=None).epoch_done({"epoch": 1.0, "loss": 0.25, "time_s": 0.5}, 2)
        epoch 1/2  loss 0.2500  (0.50 s)
    """

    def __init__(self, log_every: int | None) -> None:
        self.log_every = log_every
        self._bar: Any = None
        self._since = time.perf_counter()
        self._steps = 0  # since the last line
        self._in_epoch = 0  # steps taken in this epoch (by this run, when it resumed one)
        self._bar_shown = 0.0  # when the bar's metrics were last refreshed
        self._said_setup = False
        self.times: RankTimes | None = None  # the ranks' step times, as last shared

    def fit_started(self, setup: RunSetup, resumed: Mapping[str, Any] | None = None) -> None:
        """Say how the run is set up (once: a second ``fit`` of the same run says nothing),
        and what a resume at another world size did to the batch (``resumed``: the batch
        facts of the checkpoint resumed from)."""
        if not self._said_setup:
            logger.info(setup.describe())
            change = setup.change_from(resumed)
            if change:
                logger.info(change)
        self._said_setup = True

    def epoch_started(self, epoch: int, epochs: int, total: int | None, done: int) -> None:
        """Epoch ``epoch`` (from 0) of ``epochs`` starts, ``done`` of ``total`` batches done."""
        self._close_bar()
        self._bar = tqdm(
            desc=f"epoch {epoch + 1}/{epochs}",
            total=total,
            initial=done,
            leave=False,
            disable=_bar_hidden(),
        )
        self._in_epoch = 0

    def batch_done(self) -> None:
        """One more batch of the epoch."""
        if self._bar is not None:
            self._bar.update(1)

    def step_done(self, where: Callable[[], str], metrics: Mapping[str, Any]) -> None:
        """After an optimizer step; ``where()`` says where (``epoch 1/3  batch 2/5``) when a
        line is due, every ``log_every`` steps of the epoch, with rank 0's step ``metrics``."""
        self._show_on_bar(metrics)
        self._steps += 1
        self._in_epoch += 1
        if not self.log_every or self._in_epoch % self.log_every or not is_main():
            return
        now = time.perf_counter()
        pace = (now - self._since) / self._steps
        self._since, self._steps = now, 0
        shown = "".join(f"  {name} {float(value):.4f}" for name, value in metrics.items())
        times = f"; {self.times.compact()}" if self.times is not None else ""
        logger.info(f"{where()}{shown}  ({pace:.3f} s/step{times})", extra=PLAIN)

    def epoch_done(
        self, metrics: dict[str, float], epochs: int, times: RankTimes | None = None
    ) -> None:
        """The epoch's line, with its metrics reduced over ranks and the ranks' step times."""
        self._close_bar()
        self.times = None  # the next epoch's come with its first shared window
        logger.info(format_epoch(metrics, epochs, times), extra=PLAIN)

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _show_on_bar(self, metrics: Mapping[str, Any]) -> None:
        if self._bar is None or self._bar.disable:
            return
        now = time.perf_counter()
        if now - self._bar_shown >= 0.5:
            self._bar_shown = now
            shown = {name: f"{float(value):.4f}" for name, value in metrics.items()}
            if self.times is not None:
                shown["time"] = self.times.per_step()
            self._bar.set_postfix(shown)


def _bar_hidden() -> bool | None:
    """Rank 0 draws the bar where someone watches: under ``ddpkit run``, when its console is
    a terminal (the worker's own stderr is a file there); elsewhere tqdm hides it when
    stderr is no terminal (``None``: CI logs, pipes)."""
    if not is_main():
        return True
    return False if os.environ.get(LIVE_CONSOLE_ENV) == "1" else None


def format_epoch(metrics: dict[str, float], epochs: int, times: RankTimes | None = None) -> str:
    """One log line for an epoch's metrics (the step-time and memory figures: ``times``).

    Example:
        >>> format_epoch({"epoch": 2.0, "loss": 0.5, "val_loss": 0.7, "time_s": 3.0}, 10)
        'epoch 2/10  loss 0.5000  val_loss 0.7000  (3.00 s)'
    """
    parts = [f"epoch {int(metrics['epoch'])}/{epochs}"]
    shown = {k: v for k, v in metrics.items() if k not in ("epoch", "time_s")}
    parts += [f"{k} {v:.4f}" for k, v in shown.items() if not _unshown(k)]
    timing = f"; {times.compact()}" if times is not None else ""
    parts.append(f"({metrics['time_s']:.2f} s{timing})")
    return "  ".join(parts)


def _unshown(name: str) -> bool:
    """Counts, and the figures the epoch line shows in its own form."""
    return name.endswith("samples") or name.startswith(("time/", "mem/"))


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
