"""Callbacks: code at fixed points of training, one set of hooks for everyone who listens.

The user's callbacks (``Trainer(callbacks=[...])``, ``TrainLoop(callbacks=[...])``), ddpkit's
own listeners (the experiment log, the bench report) and the tools' observers (``ddpkit
verify``'s recorder) are all :class:`Callback` subclasses, called through one dispatcher
(:class:`Events`, the run's one event channel) with the same hook names. Hooks run on rank 0
only unless the callback sets ``rank_zero_only = False`` (then on every rank, in the same
order, so a hook may call a collective). A rank-0 hook must not call a collective: the others
never join it.

=========================== ==========================================================
hook                        when, and with what (``trainer``: the Trainer or TrainLoop)
=========================== ==========================================================
``on_model_built``          ``prepare_model`` got ``model``, before wrapping (registered
                            callbacks only: no training run exists yet)
``on_fit_start``            training starts, after resuming (``trainer.setup`` says how)
``on_train_epoch_start``    an epoch starts; ``epoch`` counts from 1, as the log does
``on_train_batch_start``    a training batch was loaded, as the loader gave it
``on_train_batch_end``      after each training batch (and its optimizer step, if any):
                            the batch and this rank's metrics for it, not yet reduced
``on_replicas_checked``     the replicas were compared after ``step``; return True to
                            report a divergence yourself (training then goes on)
``on_validation_end``       after ``evaluate``: the metrics reduced over ranks
``on_train_epoch_end``      after the epoch and its validation: its metrics, which the
                            hook may add to (shown in the epoch line)
``on_save_checkpoint``      before a checkpoint is written: add entries to ``state``
``on_load_checkpoint``      after a checkpoint was loaded: its ``state``
``on_fit_end``              training is done, or stopped early (``trainer.stopped`` says why)
=========================== ==========================================================

:func:`register_callback` adds a callback to every training run of this process, and to
``prepare_model``: how a tool hooks into a script it runs without the library importing it.

Example:
    >>> class LossHistory(Callback):
    ...     def __init__(self): self.losses = []
    ...     def on_train_epoch_end(self, trainer, metrics): self.losses.append(metrics["loss"])
    >>> history = LossHistory()
    >>> history.on_train_epoch_end(None, {"loss": 0.5}); history.losses
    [0.5]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from torch import nn

from ddpkit.errors import ConfigError
from ddpkit.runtime.collectives import is_main

if TYPE_CHECKING:
    from ddpkit.env.world import World

CallbackT = TypeVar("CallbackT", bound="Callback")
# The registered callbacks, live: read it (its truth is "any registered?", an attribute read on
# the loop's path, not a call); change it only through register_callback/unregister_callback.
REGISTERED: list[Callback] = []


class SetupRecord(Protocol):
    """A run's set-up as its hooks see it (``ddpkit.observe.runsetup.RunSetup``)."""

    def record(self) -> dict[str, Any]: ...


class RunView(Protocol):
    """What a hook may read of the run it is called for, the Trainer and the TrainLoop alike:
    ddpkit's own callbacks are typed with it (yours may keep ``trainer`` untyped, or use it).

    Example::

        class Steps(ddpkit.Callback):
            def on_train_epoch_end(self, trainer: RunView, metrics):
                print(trainer.step, trainer.world.world_size)
    """

    @property
    def model(self) -> nn.Module: ...

    @property
    def optimizers(self) -> Mapping[str, Any]: ...

    @property
    def step(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    @property
    def world(self) -> World: ...

    @property
    def setup(self) -> SetupRecord | None: ...

    @property
    def loader(self) -> Any: ...


class Callback:
    """Hooks into training; each does nothing unless overridden. Rank 0 only by default.

    Example:
        >>> class Everywhere(Callback):
        ...     rank_zero_only = False
        >>> Everywhere().rank_zero_only
        False
    """

    rank_zero_only: bool = True

    def on_model_built(self, model: nn.Module) -> None:
        """``prepare_model`` received ``model`` (before wrapping evens out the ranks)."""

    def on_fit_start(self, trainer: Any) -> None:
        """Training starts (after resuming)."""

    def on_train_epoch_start(self, trainer: Any, epoch: int) -> None:
        """Epoch ``epoch`` (from 1) starts."""

    def on_train_batch_start(self, trainer: Any, batch: Any) -> None:
        """A training batch was loaded, before it is moved to the device."""

    def on_train_batch_end(self, trainer: Any, batch: Any, metrics: Mapping[str, Any]) -> None:
        """A training batch is done; ``metrics`` are this rank's, for this batch."""

    def on_replicas_checked(
        self, trainer: Any, step: int, divergence: Mapping[str, Any] | None
    ) -> bool:
        """The replicas were compared; True: this callback reports a divergence itself."""
        return False

    def on_validation_end(self, trainer: Any, metrics: Mapping[str, float]) -> None:
        """``evaluate`` is done; ``metrics`` are reduced over ranks."""

    def on_train_epoch_end(self, trainer: Any, metrics: dict[str, float]) -> None:
        """The epoch (and its validation) is done; entries the hook adds to ``metrics`` are
        shown in the epoch line and kept in the history."""

    def on_save_checkpoint(self, trainer: Any, state: dict[str, Any]) -> None:
        """A checkpoint is about to be written: entries added to ``state`` are saved."""

    def on_load_checkpoint(self, trainer: Any, state: Mapping[str, Any]) -> None:
        """A checkpoint was loaded into the run; ``state`` is what it held."""

    def on_fit_end(self, trainer: Any) -> None:
        """Training is done, or was stopped early (``trainer.stopped``)."""


HOOKS = tuple(name for name in vars(Callback) if name.startswith("on_"))


def register_callback(callback: CallbackT) -> CallbackT:
    """Add ``callback`` to every training run of this process, and to ``prepare_model``.

    Example:
        >>> unregister_callback(register_callback(Callback()))
    """
    REGISTERED.append(callback)
    return callback


def unregister_callback(callback: Callback) -> None:
    """Stop calling ``callback`` (no error if it was not registered).

    Example:
        >>> unregister_callback(Callback())
    """
    if callback in REGISTERED:
        REGISTERED.remove(callback)


def registered_callbacks() -> tuple[Callback, ...]:
    """The registered callbacks, in registration order.

    Example:
        >>> registered_callbacks()
        ()
    """
    return tuple(REGISTERED)


class Events:
    """Calls every listening callback's hook, on the ranks each asks for.

    ``owner`` is what every hook receives first: the run's public face (the Trainer, or the
    TrainLoop), given once when the run is assembled.

    Example:
        >>> Events([object()])
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: callbacks must be ddpkit.Callback instances; got a object
    """

    def __init__(
        self, callbacks: Iterable[Any] = (), builtins: Iterable[Callback] = (), owner: Any = None
    ) -> None:
        self.callbacks = list(callbacks)
        for callback in self.callbacks:
            if not isinstance(callback, Callback):
                raise ConfigError(
                    f"callbacks must be ddpkit.Callback instances; got a {type(callback).__name__}"
                )
        self.callbacks += list(builtins)
        self.owner = owner
        self._listening: dict[str, list[Callback]] = {}

    def listens(self, hook: str) -> bool:
        """Whether a callback of this run overrides ``hook`` and runs on this rank (those
        registered aside: :data:`REGISTERED` says, read live).

        Example:
            >>> Events().listens("on_train_batch_end")
            False
        """
        return bool(self._own(hook))

    def _own(self, hook: str) -> list[Callback]:
        """This run's callbacks that have ``hook``: the same for the whole run, found once."""
        callbacks = self._listening.get(hook)
        if callbacks is None:
            callbacks = self._listening[hook] = _listeners(self.callbacks, hook)
        return callbacks

    def call(self, hook: str, *args: Any) -> list[Any]:
        """Run ``hook`` of every callback that overrides it and runs on this rank; their
        return values, in order.

        Example:
            >>> Events().call("on_fit_end")
            []
        """
        callbacks = self._listening.get(hook)  # written out: a call less a batch
        if callbacks is None:
            callbacks = self._own(hook)
        if REGISTERED:  # usually none: nothing more to look at per batch
            callbacks = callbacks + _listeners(registered_callbacks(), hook)
        if not callbacks:  # most hooks, every batch: no comprehension's frame to run
            return []
        return [getattr(callback, hook)(self.owner, *args) for callback in callbacks]


def _listeners(callbacks: Iterable[Callback], hook: str) -> list[Callback]:
    assert hook in HOOKS, hook
    main = is_main()
    return [
        callback
        for callback in callbacks
        if (main or not callback.rank_zero_only)
        and getattr(type(callback), hook) is not getattr(Callback, hook)
    ]
