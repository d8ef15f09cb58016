"""The one event channel of a training run: every listener, every hook, one dispatcher.

A run's :class:`Events` calls the user's callbacks (which may add to an epoch's metrics),
then ddpkit's (the bench report, the experiment log), then those registered for the whole
process (``ddpkit verify``'s recorder), through :class:`~ddpkit.runtime.callbacks.Callback`'s
hooks. Each hook receives the run's public face first (the ``Trainer``, or the ``TrainLoop``).

Example:
    >>> from ddpkit.runtime.callbacks import Callback
    >>> class Count(Callback):
    ...     def __init__(self): self.epochs = 0
    ...     def on_train_epoch_end(self, trainer, metrics): self.epochs += 1
    >>> count = Count()
    >>> Events([count]).call("on_train_epoch_end", {"loss": 0.5})
    [None]
    >>> count.epochs
    1
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ddpkit.errors import ConfigError
from ddpkit.runtime.callbacks import HOOKS, Callback, registered_callbacks
from ddpkit.runtime.collectives import is_main


class Events:
    """Calls every listening callback's hook, on the ranks each asks for.

    ``owner`` is what every hook receives first (the loop sets it to its public face).

    Example:
        >>> Events([object()])
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: callbacks must be ddpkit.Callback instances; got a object
    """

    def __init__(self, callbacks: Iterable[Any] = (), builtins: Iterable[Callback] = ()) -> None:
        self.callbacks = list(callbacks)
        for callback in self.callbacks:
            if not isinstance(callback, Callback):
                raise ConfigError(
                    f"callbacks must be ddpkit.Callback instances; got a {type(callback).__name__}"
                )
        self.callbacks += list(builtins)
        self.owner: Any = None
        self._listening: dict[str, list[Callback]] = {}

    def call(self, hook: str, *args: Any) -> list[Any]:
        """Run ``hook`` of every callback that overrides it and runs on this rank; their
        return values, in order.

        Example:
            >>> Events().call("on_fit_end")
            []
        """
        callbacks = self._listening.get(hook)
        if callbacks is None:  # the same for the whole run: found once
            callbacks = self._listening[hook] = _listeners(self.callbacks, hook)
        registered = registered_callbacks()  # usually none: nothing to look at per batch
        if registered:
            callbacks = callbacks + _listeners(registered, hook)
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
