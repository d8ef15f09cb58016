"""Names ddpkit changed, in one place: an old keyword keeps working for one release with a
warning that names the new one; a removed name answers with the same kind of error, naming
what replaced it.

Durations are in seconds everywhere, and a name says what it bounds, not its unit (``timeout``,
``hang_timeout``, ``flush_every``), as Python's standard library (``subprocess.run(timeout=)``)
and torchrun's flags (``--monitor-interval``, ``--shutdown-timeout``) spell them: so
``ReplicaGroups(timeout_s=)`` became ``timeout=``, and ``ddpkit lighthouse --heartbeat-ms``
became ``--heartbeat-timeout`` in seconds.

Example:
    >>> @renamed_keywords({"timeout_s": "timeout"}, removed_in="0.3")
    ... def wait(timeout: float = 1.0) -> float:
    ...     return timeout
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as said:
    ...     warnings.simplefilter("always")
    ...     wait(timeout_s=2.0), str(said[0].message)
    (2.0, 'wait(timeout_s=...) is now wait(timeout=...); the old name goes in ddpkit 0.3')
"""

from __future__ import annotations

import argparse
import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ddpkit._core.log import logger
from ddpkit.errors import ConfigError, RemovedNameError

Target = TypeVar("Target", bound=Callable[..., Any])


def renamed_keywords(renames: Mapping[str, str], *, removed_in: str) -> Callable[[Target], Target]:
    """Decorate a function or a class (its ``__init__``): each old keyword of ``renames`` (old
    -> new) is passed on as the new one, with a ``FutureWarning`` (shown to users by default)
    at the caller's line; the old and the new given together are a ConfigError.

    Example::

        @renamed_keywords({"flush_every_s": "flush_every"}, removed_in="0.3")
        class Tracker: ...
    """

    def decorate(target: Target) -> Target:
        function = vars(target)["__init__"] if isinstance(target, type) else target
        owner = target.__name__

        @functools.wraps(function)
        def accepting_old(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        said = f"{owner}() got both {old}= and {new}="
                        raise ConfigError(f"{said}: {old} is the old name of {new}; give {new}")
                    kwargs[new] = kwargs.pop(old)
                    said = f"{owner}({old}=...) is now {owner}({new}=...)"
                    warnings.warn(f"{said}; the old name goes in ddpkit {removed_in}",
                                  FutureWarning, stacklevel=2)  # fmt: skip
            return function(*args, **kwargs)

        if isinstance(target, type):
            target.__init__ = accepting_old  # type: ignore[misc]
            return target
        return accepting_old  # type: ignore[return-value]

    return decorate


def removed_name(owner: str, name: str, replacement: str) -> RemovedNameError:
    """The error a removed public name answers with: what it was, and what to write now.

    Example:
        >>> str(removed_name("ddpkit", "export_checkpoint", "ddpkit.checkpoint.export_checkpoint"))
        'ddpkit.export_checkpoint was removed: use ddpkit.checkpoint.export_checkpoint'
    """
    return RemovedNameError(f"{owner}.{name} was removed: use {replacement}")


def renamed_flag(
    parser: argparse.ArgumentParser, old: str, new: str, *, per_unit: float, removed_in: str
) -> None:
    """Keep a command's ``old`` flag working for one release: its value, times ``per_unit``
    (``0.001`` for milliseconds given to a flag now in seconds), goes to ``new``, with a
    warning naming ``new``; ``--help`` shows ``new`` alone.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> _ = parser.add_argument("--join-timeout", type=float, default=1.0)
        >>> renamed_flag(parser, "--join-ms", "--join-timeout", per_unit=0.001, removed_in="0.3")
        >>> parser.parse_args(["--join-ms", "2500"]).join_timeout
        2.5
    """
    dest = new.lstrip("-").replace("-", "_")

    class Renamed(argparse.Action):
        def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
            logger.warning(f"{old} is now {new} (in seconds); {old} goes in ddpkit {removed_in}")
            setattr(namespace, dest, values * per_unit)

    parser.add_argument(old, action=Renamed, type=float, help=argparse.SUPPRESS)


def positional_keywords(names: tuple[str, ...], *, removed_in: str) -> Callable[[Target], Target]:
    """Decorate a class whose options are now given by name: values still given by position
    are passed on as ``names``, in order, with a ``FutureWarning`` that writes the call out.

    Example::

        @positional_keywords(("blocks", "every"), removed_in="0.3")
        class ActivationCheckpointing: ...
        ActivationCheckpointing((Block,), 2)   # works, and warns: write (blocks=..., every=...)
    """

    def decorate(target: Any) -> Any:
        init = vars(target)["__init__"]

        @functools.wraps(init)
        def by_name(self: Any, *args: Any, **kwargs: Any) -> None:
            if args:
                given = dict(zip(names, args, strict=False))
                spelled = ", ".join(f"{name}=..." for name in given)
                warnings.warn(f"{target.__name__} takes its options by name now: write "
                              f"{target.__name__}({spelled}); by position goes in ddpkit "
                              f"{removed_in}", FutureWarning, stacklevel=2)  # fmt: skip
                kwargs = {**given, **kwargs}
                args = args[len(names) :]
            init(self, *args, **kwargs)

        target.__init__ = by_name
        return target

    return decorate
