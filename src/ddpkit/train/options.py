"""The training loop's options, in three small groups, each checked once when it is made.

``Trainer`` and ``TrainLoop`` take the same keywords and build these from them, so a keyword
means the same thing in both and is refused by the same check, naming the value and the fix.

Example:
    >>> LoopOptions(accumulate=4, precision="bf16").precision
    'bf16'
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ddpkit._core.validate import check_choice, check_positive_int
from ddpkit.errors import ConfigError

Precision = Literal["fp32", "bf16", "fp16"]
NonFiniteLoss = Literal["error", "skip"]
SchedulerInterval = Literal["step", "epoch"]


@dataclass(frozen=True)
class CheckpointOptions:
    """Where checkpoints go and when: every ``save_every`` epochs and/or ``save_every_steps``
    optimizer steps (and at the end); the newest ``keep_last`` are kept (None: all);
    ``async_save``: written in the background from a copy (:mod:`ddpkit.checkpoint.background`).

    Example:
        >>> CheckpointOptions("runs/x", save_every_steps=100).enabled
        True
    """

    folder: str | os.PathLike[str] | None
    save_every: int | None = None
    save_every_steps: int | None = None
    keep_last: int | None = 3
    async_save: bool = False

    def __post_init__(self) -> None:
        if self.async_save and self.folder is None:
            raise ConfigError("async_save=True needs a checkpoint_dir to save into")
        for name in ("save_every", "save_every_steps"):
            value = getattr(self, name)
            if value is not None:
                check_positive_int(name, value)
                if self.folder is None:
                    raise ConfigError(f"{name} needs a checkpoint_dir to save into")
        if self.keep_last is not None:
            check_positive_int("keep_last", self.keep_last)

    @property
    def enabled(self) -> bool:
        """True when there is a folder to save into."""
        return self.folder is not None


@dataclass(frozen=True)
class LoopOptions:
    """How each step is made: ``accumulate`` batches per optimizer step, ``precision``,
    ``clip_grad_norm``, ``nonfinite_loss`` (``"error"`` or ``"skip"``),
    ``check_replicas_every`` steps, and when the schedulers step (``scheduler_interval``).

    Example:
        >>> LoopOptions(clip_grad_norm=0.0)
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: clip_grad_norm must be > 0 (got 0.0)
    """

    accumulate: int = 1
    precision: Precision = "fp32"
    clip_grad_norm: float | None = None
    nonfinite_loss: NonFiniteLoss = "error"
    check_replicas_every: int | None = None
    scheduler_interval: SchedulerInterval = "step"

    def __post_init__(self) -> None:
        check_positive_int("accumulate", self.accumulate)
        check_choice("precision", self.precision, get_args(Precision))
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ConfigError(f"clip_grad_norm must be > 0 (got {self.clip_grad_norm!r})")
        check_choice("nonfinite_loss", self.nonfinite_loss, get_args(NonFiniteLoss))
        if self.check_replicas_every is not None:
            check_positive_int("check_replicas_every", self.check_replicas_every)
        check_choice("scheduler_interval", self.scheduler_interval, get_args(SchedulerInterval))


@dataclass(frozen=True)
class LogOptions:
    """What the run shows: a line every ``log_every`` optimizer steps on rank 0, the
    experiment log (TensorBoard + CSV) in ``log_dir``, and the trackers of ``loggers``
    ("mlflow", "wandb" or :class:`~ddpkit.observe.trackers.Tracker` objects).

    Example:
        >>> LogOptions(log_every=0)
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: log_every must be a positive integer (got 0)
    """

    log_every: int | None = None
    log_dir: str | os.PathLike[str] | None = None
    loggers: Sequence[Any] = ()

    def __post_init__(self) -> None:
        if self.log_every is not None:
            check_positive_int("log_every", self.log_every)
        if isinstance(self.loggers, str):  # loggers="mlflow" would be six trackers
            raise ConfigError(f"loggers must be a list, like [{self.loggers!r}]")
