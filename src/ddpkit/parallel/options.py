"""A strategy's options checked when its object is made: each value against its field's type
and, where one is declared, its range, so that ``DDPStrategy(bucket_cap_mb="big")`` is a
:class:`~ddpkit.errors.ConfigError` naming the option, the value and what it takes, and not
a ValueError deep in torch at the first wrap.

A field's type is its annotation (``bool``, ``int``, ``float``, ``str``, a ``Literal``, a
tuple of classes, ``X | None``); a range is declared with :func:`bounded`.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Opts:
    ...     cap_mb: float | None = bounded(None, above=0, means="MB")
    >>> check_given(Opts, {"cap_mb": -1})
    Traceback (most recent call last):
    ...
    ddpkit.errors.ConfigError: Opts(cap_mb=-1): cap_mb takes a number > 0 (MB), or None; got -1
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any

from ddpkit.errors import ConfigError

_BOUNDS = "ddpkit_bounds"


@dataclass(frozen=True)
class Bounds:
    """Where a number option's values lie: ``>= least``, ``> above``; ``means`` says in what.

    Example:
        >>> Bounds(least=1).text()
        ' >= 1'
    """

    least: float | None = None
    above: float | None = None
    means: str = ""

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies within the bounds."""
        low_ok = self.least is None or value >= self.least
        return low_ok and (self.above is None or value > self.above)

    def text(self) -> str:
        """The bounds as the message words them."""
        parts = [f" >= {self.least:g}" if self.least is not None else "",
                 f" > {self.above:g}" if self.above is not None else ""]  # fmt: skip
        return "".join(parts) + (f" ({self.means})" if self.means else "")


def bounded(default: Any, *, least: float | None = None, above: float | None = None,
            means: str = "") -> Any:  # fmt: skip
    """A dataclass field whose number lies within bounds (checked with its type).

    Example::

        timeout_s: float = bounded(30.0, above=0, means="seconds")
    """
    return dataclasses.field(default=default, metadata={_BOUNDS: Bounds(least, above, means)})


def check_given(cls: type, given: dict[str, Any]) -> None:
    """Refuse any of ``given`` (option name to value) whose value ``cls``'s field cannot take.

    Example:
        >>> import ddpkit
        >>> check_given(ddpkit.DDPStrategy, {"static_graph": "yes"})
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: DDPStrategy(static_graph='yes'): static_graph takes True ...
    """
    hints = _hints(cls)
    for field in dataclasses.fields(cls):
        if field.name not in given or field.name not in hints:
            continue
        value, hint = given[field.name], hints[field.name]
        bounds = field.metadata.get(_BOUNDS)
        if not _conforms(value, hint) or (bounds is not None and not _within(value, bounds)):
            call = f"{cls.__name__}({field.name}={value!r})"
            raise ConfigError(
                f"{call}: {field.name} takes {_describe(hint, bounds)}; got {value!r}"
            )


def _hints(cls: type) -> dict[str, Any]:
    """The fields' annotations, resolved where each class of the hierarchy defined them."""
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        module = sys.modules.get(klass.__module__)
        space = {**vars(typing), **(vars(module) if module else {})}
        for name, text in vars(klass).get("__annotations__", {}).items():
            try:
                hints[name] = eval(text, space) if isinstance(text, str) else text
            except Exception:  # a name only a type checker sees: not checked here
                hints.pop(name, None)
    return hints


def _conforms(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arg) for arg in args)
    if hint is None or hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in args
    if origin is type:
        return isinstance(value, type) and issubclass(value, args[0])
    if origin is tuple:  # a list is taken too (the strategy keeps it as a tuple)
        items = args[0] if args else Any
        return isinstance(value, tuple | list) and all(_conforms(v, items) for v in value)
    return _conforms_plain(value, hint)


def _conforms_plain(value: Any, hint: Any) -> bool:
    if hint is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):  # an int to Python, never a count or a size here
        return False
    if hint is float:
        return isinstance(value, int | float) and math.isfinite(value)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _within(value: Any, bounds: Bounds) -> bool:
    return value is None or bounds.holds(value)


def _describe(hint: Any, bounds: Bounds | None = None) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        kinds = [_describe(arg, bounds) for arg in args if arg is not type(None)]
        none = ", or None" if type(None) in args else ""
        return " or ".join(kinds) + none
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(arg) for arg in args)
    if origin is tuple:
        return f"a tuple of {_describe(args[0]) if args else 'values'}"
    if origin is type:
        home = "nn." if args[0].__module__.startswith("torch.nn") else ""
        return f"{home}{args[0].__name__} classes"
    words = {bool: "True or False", int: "an integer", float: "a number", str: "a string"}
    return words.get(hint, getattr(hint, "__name__", str(hint))) + (bounds.text() if bounds else "")
