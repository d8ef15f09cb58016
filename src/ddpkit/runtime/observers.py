"""Observers: how diagnostics watch training without library code importing them.

``prepare_model`` and the Trainer report what happens to every registered observer: a model
was built, training started, an epoch began, a batch was loaded, the replicas were compared,
training finished. ``ddpkit verify``'s recorder is such an observer; its command registers it
in the workers it starts (through ``DDPKIT_WORKER_SETUP``, see :mod:`ddpkit.launch.worker`),
so no module of the library imports it. An observer overrides the methods it needs.

Example:
    >>> class Count(Observer):
    ...     def __init__(self): self.batches = 0
    ...     def batch_loaded(self, batch): self.batches += 1
    >>> counter = add_observer(Count())
    >>> for observer in observers(): observer.batch_loaded(None)
    >>> counter.batches
    1
    >>> remove_observer(counter)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from torch import nn

ObserverT = TypeVar("ObserverT", bound="Observer")
_observers: list[Observer] = []


class Observer:
    """What training reports; every method does nothing unless overridden.

    Example:
        >>> Observer().replicas_checked(4, None)
        False
    """

    def model_built(self, model: nn.Module) -> None:
        """``prepare_model`` received ``model`` (before wrapping evens out the ranks)."""

    def fit_started(self, model: nn.Module, setup: Mapping[str, Any]) -> None:
        """``fit`` starts; ``setup`` is the run's set-up (global batch, LR, strategy...)."""

    def epoch_started(self, loader: Iterable[Any]) -> None:
        """An epoch starts; its sampler was told the epoch."""

    def batch_loaded(self, batch: Any) -> None:
        """A training batch was loaded, before it reaches the model."""

    def replicas_checked(self, step: int, divergence: Mapping[str, Any] | None) -> bool:
        """The replicas were compared after ``step``; True: the observer reports a
        divergence itself, so training does not stop for it."""
        return False

    def fit_finished(self, model: nn.Module, steps: int) -> None:
        """``fit`` ended (or was stopped by a step limit) after ``steps`` optimizer steps."""


def add_observer(observer: ObserverT) -> ObserverT:
    """Register ``observer`` for this process; returns it.

    Example:
        >>> remove_observer(add_observer(Observer()))
    """
    _observers.append(observer)
    return observer


def remove_observer(observer: Observer) -> None:
    """Stop reporting to ``observer`` (no error if it was not registered).

    Example:
        >>> remove_observer(Observer())
    """
    if observer in _observers:
        _observers.remove(observer)


def observers() -> tuple[Observer, ...]:
    """The registered observers, in registration order.

    Example:
        >>> observers()
        ()
    """
    return tuple(_observers)
