"""Callbacks: your code at the points of training you want to hook, on rank 0 or every rank.

Subclass :class:`Callback`, override the hooks you need, and pass instances to
``Trainer(callbacks=[...])``. Hooks run on rank 0 only unless the callback sets
``rank_zero_only = False`` (then on every rank, in the same order, so a hook may call a
collective). A rank-0 hook must not call a collective: the other ranks would never join it.

=========================== ==========================================================
hook                        when, and with what
=========================== ==========================================================
``on_fit_start``            ``fit`` starts, after resuming (``trainer.epoch``/``step`` say where)
``on_train_epoch_start``    an epoch starts; ``epoch`` counts from 1, as the log does
``on_train_batch_end``      after each training batch (and its optimizer step, if any):
                            the batch and this rank's step metrics, not yet reduced
``on_validation_end``       after ``evaluate``: the metrics reduced over ranks
``on_train_epoch_end``      after the epoch and its validation: the epoch's metrics,
                            which the hook may add to (shown in the epoch line)
``on_save_checkpoint``      before a checkpoint is written: add entries to ``state``
``on_load_checkpoint``      after a checkpoint was loaded: its ``state``
``on_fit_end``              ``fit`` is done
=========================== ==========================================================

Example:
    >>> class LossHistory(Callback):
    ...     def __init__(self): self.losses = []
    ...     def on_train_epoch_end(self, trainer, metrics): self.losses.append(metrics["loss"])
    >>> history = LossHistory()
    >>> Callbacks([history]).call("on_train_epoch_end", None, {"loss": 0.5})
    >>> history.losses
    [0.5]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ddpkit.errors import ConfigError
from ddpkit.runtime.collectives import is_main

HOOKS = (
    "on_fit_start",
    "on_train_epoch_start",
    "on_train_batch_end",
    "on_validation_end",
    "on_train_epoch_end",
    "on_save_checkpoint",
    "on_load_checkpoint",
    "on_fit_end",
)


class Callback:
    """Hooks into training; each does nothing unless overridden. Rank 0 only by default.

    Example:
        >>> class Everywhere(Callback):
        ...     rank_zero_only = False
        >>> Everywhere().rank_zero_only
        False
    """

    rank_zero_only: bool = True

    def on_fit_start(self, trainer: Any) -> None:
        """``fit`` starts (after resuming)."""

    def on_train_epoch_start(self, trainer: Any, epoch: int) -> None:
        """Epoch ``epoch`` (from 1) starts."""

    def on_train_batch_end(self, trainer: Any, batch: Any, metrics: Mapping[str, Any]) -> None:
        """A training batch is done; ``metrics`` are this rank's, for this batch."""

    def on_validation_end(self, trainer: Any, metrics: Mapping[str, float]) -> None:
        """``evaluate`` is done; ``metrics`` are reduced over ranks."""

    def on_train_epoch_end(self, trainer: Any, metrics: Mapping[str, float]) -> None:
        """The epoch (and its validation) is done; ``metrics`` are its reduced metrics.

        Entries the hook adds are shown in the epoch line and kept in the history.
        """

    def on_save_checkpoint(self, trainer: Any, state: dict[str, Any]) -> None:
        """A checkpoint is about to be written: entries added to ``state`` are saved."""

    def on_load_checkpoint(self, trainer: Any, state: Mapping[str, Any]) -> None:
        """A checkpoint was loaded into the trainer; ``state`` is what it held."""

    def on_fit_end(self, trainer: Any) -> None:
        """``fit`` is done."""


class Callbacks:
    """The Trainer's callbacks, called in order, each on the ranks it asks for.

    Example:
        >>> Callbacks([object()])
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: callbacks must be ddpkit.Callback instances; got a object
    """

    def __init__(self, callbacks: Iterable[Any] = ()) -> None:
        self.callbacks = list(callbacks)
        for callback in self.callbacks:
            if not isinstance(callback, Callback):
                raise ConfigError(
                    f"callbacks must be ddpkit.Callback instances; got a {type(callback).__name__}"
                )

    def call(self, hook: str, *args: Any) -> None:
        """Run ``hook`` of every callback that runs on this rank.

        Example:
            >>> Callbacks().call("on_fit_end", None)
        """
        assert hook in HOOKS, hook
        main = is_main()
        for callback in self.callbacks:
            if main or not callback.rank_zero_only:
                getattr(callback, hook)(*args)
