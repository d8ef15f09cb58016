"""The keywords ``prepare_model`` took before each strategy held its own options, refused with
the call that replaced them.

``prepare_model(model, "fsdp", fsdp_units=(Block,), mixed_precision="bf16")`` is now
``prepare_model(model, ddpkit.FSDPStrategy(units=(Block,), mixed_precision="bf16"))``. A
script written the old way stops with a ConfigError that writes its new call out, rather
than a TypeError about an unexpected keyword; so does any keyword prepare_model never had.

Example:
    >>> new_spelling("fsdp", {"mixed_precision": "bf16"})
    "prepare_model(model, ddpkit.FSDPStrategy(mixed_precision='bf16'))"
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from ddpkit.errors import ConfigError
from ddpkit.parallel.base import Strategy, option_text
from ddpkit.parallel.ddp import DDPStrategy
from ddpkit.parallel.fsdp import FSDPStrategy
from ddpkit.parallel.hsdp import HSDPStrategy

Prepare = TypeVar("Prepare", bound=Callable[..., Any])

DDP_FIELDS = DDPStrategy.fields()
RENAMED = {"fsdp_units": "units", "hsdp_shard_size": "shard_size"}  # old -> field
MOVED = (*DDP_FIELDS, *RENAMED, "mixed_precision", "activation_checkpointing_every")


def refuses_moved_keywords(prepare: Prepare) -> Prepare:
    """Wrap ``prepare_model``: a moved keyword or an unknown one is a ConfigError with the fix;
    ``inspect.signature`` and ``help()`` still show the real keywords.

    Example::

        prepare_model(net, "fsdp", fsdp_units=(Block,))   # ConfigError: ... write
        # prepare_model(model, ddpkit.FSDPStrategy(units=(Block,)))
    """
    keywords = inspect.signature(prepare).parameters

    @functools.wraps(prepare)
    def checked(*args: Any, **kwargs: Any) -> Any:
        moved = {name: kwargs.pop(name) for name in list(kwargs) if name in MOVED}
        if moved:
            strategy = args[1] if len(args) > 1 else kwargs.get("strategy", "ddp")
            fix = new_spelling(strategy, moved, kwargs.get("activation_checkpointing"))
            raise ConfigError(
                f"prepare_model() no longer takes {', '.join(moved)}: a strategy's options "
                f"are given to its object now. Write {fix}"
            )
        unknown = [name for name in kwargs if name not in keywords]
        if unknown:
            raise ConfigError(
                f"prepare_model() has no keyword {unknown[0]!r}; its keywords: "
                f"{', '.join(list(keywords)[1:])}. A strategy's options are given to its "
                "object: ddpkit.DDPStrategy(...), FSDPStrategy(...), HSDPStrategy(...)"
            )
        return prepare(*args, **kwargs)

    return checked  # type: ignore[return-value]


def new_spelling(strategy: object, moved: dict[str, Any], recompute: object = None) -> str:
    """The call that does what ``prepare_model(model, strategy, **moved)`` did (or meant).

    Example:
        >>> new_spelling("ddp", {"bucket_cap_mb": 50})
        'prepare_model(model, ddpkit.DDPStrategy(bucket_cap_mb=50))'
    """
    moved = dict(moved)
    every = moved.pop("activation_checkpointing_every", None)
    options = {RENAMED.get(name, name): value for name, value in moved.items()}
    parts, note = ["model"], ""
    if options:
        owner = _strategy_class(strategy, options)
        given = ", ".join(f"{name}={option_text(value)}" for name, value in options.items())
        parts.append(f"ddpkit.{owner.__name__}({given})")
        if isinstance(strategy, str) and strategy != owner.name:
            verb = "belongs" if len(options) == 1 else "belong"
            note = f" ({', '.join(options)} {verb} to {owner.__name__}, not to {strategy!r})"
    elif strategy != "ddp":
        parts.append(repr(strategy))
    if every is not None:
        blocks = (
            f"blocks={option_text(tuple(recompute))}, "
            if isinstance(recompute, list | tuple)
            else ""
        )
        parts.append(
            f"activation_checkpointing=ddpkit.ActivationCheckpointing({blocks}every={every!r})"
        )
    return f"prepare_model({', '.join(parts)}){note}"


def _strategy_class(strategy: object, options: dict[str, Any]) -> type[Strategy]:
    if isinstance(strategy, Strategy):
        return type(strategy)
    if any(name in DDP_FIELDS for name in options):
        return DDPStrategy
    return HSDPStrategy if strategy == "hsdp" or "shard_size" in options else FSDPStrategy
