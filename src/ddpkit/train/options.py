"""The training loop's options, in three small groups, each checked once when it is made.

``Trainer`` and ``TrainLoop`` take the same keywords (:class:`LoopKeywords`) and build these
through one path, :meth:`RunOptions.of`, so a keyword means the same thing in both, has one
default (the field's below) and is refused by the same check, naming the value and the fix.

Example:
    >>> RunOptions.of("TrainLoop", None, {"accumulate": 4, "precision": "bf16"}).loop.precision
    'bf16'
"""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ForwardRef, Literal, TypedDict, TypeVar, get_args

from ddpkit._core.validate import check_choice, check_positive_int
from ddpkit.errors import ConfigError
from ddpkit.observe.profiling.spec import ProfileSpec

if TYPE_CHECKING:
    from ddpkit.faulttolerance.groups import ReplicaGroups

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
    ``check_replicas_every`` steps, when the schedulers step (``scheduler_interval``), and
    the ``replica_groups`` each step is averaged across (experimental,
    :class:`~ddpkit.ReplicaGroups`).

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
    replica_groups: ReplicaGroups | None = None

    def __post_init__(self) -> None:
        check_positive_int("accumulate", self.accumulate)
        check_choice("precision", self.precision, get_args(Precision))
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ConfigError(f"clip_grad_norm must be > 0 (got {self.clip_grad_norm!r})")
        check_choice("nonfinite_loss", self.nonfinite_loss, get_args(NonFiniteLoss))
        if self.check_replicas_every is not None:
            check_positive_int("check_replicas_every", self.check_replicas_every)
        check_choice("scheduler_interval", self.scheduler_interval, get_args(SchedulerInterval))
        if self.replica_groups is not None:
            from ddpkit.faulttolerance.groups import ReplicaGroups

            if not isinstance(self.replica_groups, ReplicaGroups):
                raise ConfigError(f"replica_groups takes a ddpkit.ReplicaGroups(...), not "
                                  f"{type(self.replica_groups).__name__}")  # fmt: skip
            if self.nonfinite_loss == "skip":  # a group would skip a step the others take
                raise ConfigError("nonfinite_loss='skip' is not supported with replica_groups "
                                  "yet; use nonfinite_loss='error'")  # fmt: skip


@dataclass(frozen=True)
class LogOptions:
    """What the run shows: a line every ``log_every`` optimizer steps on rank 0, the
    experiment log (TensorBoard + CSV) in ``log_dir``, the trackers of ``loggers``
    ("mlflow", "wandb" or :class:`~ddpkit.observe.trackers.Tracker` objects), and a
    ``profile`` of a window of steps (``"200-205"`` or a
    :class:`~ddpkit.observe.profiling.spec.ProfileSpec`; ``ddpkit run --profile`` wins).

    Example:
        >>> LogOptions(log_every=0)
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: log_every must be a positive integer (got 0)
    """

    log_every: int | None = None
    log_dir: str | os.PathLike[str] | None = None
    loggers: Sequence[Any] = ()
    profile: str | ProfileSpec | None = None

    def __post_init__(self) -> None:
        ProfileSpec.of(self.profile)  # a bad window is refused here, before training
        if self.log_every is not None:
            check_positive_int("log_every", self.log_every)
        if isinstance(self.loggers, str):  # loggers="mlflow" would be six trackers
            raise ConfigError(f"loggers must be a list, like [{self.loggers!r}]")


class LoopKeywords(TypedDict, total=False):
    """The keywords both faces take; each one's default and meaning is its option's field:
    :class:`CheckpointOptions` (``save_every``, ``save_every_steps``, ``keep_last``,
    ``async_save``), :class:`LoopOptions` (``accumulate``, ``precision``,
    ``clip_grad_norm``, ``nonfinite_loss``, ``check_replicas_every``, ``replica_groups``) and
    :class:`LogOptions` (``log_every``, ``log_dir``, ``loggers``, ``profile``).

    Example:
        >>> sorted(LoopKeywords.__annotations__)[:3]
        ['accumulate', 'async_save', 'check_replicas_every']
    """

    save_every: int | None
    save_every_steps: int | None
    keep_last: int | None
    async_save: bool
    accumulate: int
    precision: Precision
    clip_grad_norm: float | None
    nonfinite_loss: NonFiniteLoss
    check_replicas_every: int | None
    replica_groups: ReplicaGroups | None
    log_every: int | None
    log_dir: str | os.PathLike[str] | None
    loggers: Sequence[Any]
    profile: str | ProfileSpec | None


@dataclass(frozen=True)
class RunOptions:
    """A run's three option groups, built from the keywords the same way for both faces.

    Example:
        >>> try:
        ...     RunOptions.of("Trainer", None, {"save_evry": 2})
        ... except ConfigError as error:
        ...     print(error)
        Trainer got an unknown keyword 'save_evry'; did you mean 'save_every'?
    """

    saving: CheckpointOptions
    loop: LoopOptions
    logging: LogOptions

    @classmethod
    def of(
        cls,
        face: str,
        checkpoint_dir: str | os.PathLike[str] | None,
        keywords: Mapping[str, Any],
        scheduler_interval: SchedulerInterval = "step",
    ) -> RunOptions:
        """The options of ``face`` (``"Trainer"`` or ``"TrainLoop"``, for the messages)."""
        _refuse_unknown(face, keywords)
        return cls(
            CheckpointOptions(checkpoint_dir, **_fields_of(CheckpointOptions, keywords)),
            LoopOptions(**_fields_of(LoopOptions, keywords), scheduler_interval=scheduler_interval),
            LogOptions(**_fields_of(LogOptions, keywords)),
        )


Init = TypeVar("Init", bound=Callable[..., None])


def shows_loop_keywords(init: Init) -> Init:
    """Write each loop keyword, with its default, into ``init``'s signature in place of
    ``**options``: ``inspect.signature``, ``help()`` and a notebook's completion show them,
    while the keywords still arrive in ``options``, checked once by :meth:`RunOptions.of`.
    Type checkers and IDEs read the same keywords from ``Unpack[LoopKeywords]``.

    Example:
        >>> @shows_loop_keywords
        ... def make(self, model, **options) -> None: ...
        >>> inspect.signature(make).parameters["keep_last"]
        <Parameter "keep_last: 'int | None' = 3">
    """
    signature = inspect.signature(init)
    kept = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    init.__signature__ = signature.replace(parameters=[*kept, *_loop_parameters()])  # type: ignore[attr-defined]
    return init


def _loop_parameters() -> list[inspect.Parameter]:
    groups = (CheckpointOptions, LoopOptions, LogOptions)
    defaults = {f.name: f.default for group in groups for f in fields(group)}
    keyword = inspect.Parameter.KEYWORD_ONLY
    return [
        inspect.Parameter(name, keyword, default=defaults[name], annotation=_text(annotation))
        for name, annotation in LoopKeywords.__annotations__.items()
    ]


def _text(annotation: Any) -> Any:
    """A TypedDict's annotation as written (it holds them as ForwardRefs)."""
    return annotation.__forward_arg__ if isinstance(annotation, ForwardRef) else annotation


def _fields_of(options: type, keywords: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(options)}
    return {name: value for name, value in keywords.items() if name in names}


def _refuse_unknown(face: str, keywords: Mapping[str, Any]) -> None:
    known = list(LoopKeywords.__annotations__)
    for name in keywords:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; it takes {', '.join(known)}"
            raise ConfigError(f"{face} got an unknown keyword {name!r}{hint}")
