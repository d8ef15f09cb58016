"""``torch.compile`` with DDP and FSDP: compiled last, checkpoints as if never compiled.

The order matters. ``torch.compile(DDP(model))`` lets Dynamo's DDP optimizer split the graph
at DDP's gradient-bucket boundaries, so each bucket's all-reduce still overlaps the rest of
the backward pass; ``DDP(torch.compile(model))`` hides the buckets from the compiler. FSDP2
likewise wants its ``fully_shard`` units in place before the compiler traces them. So
``prepare_model(model, compile=True)`` wraps first and compiles the wrapper, and a model the
user compiled beforehand is taken out of its ``OptimizedModule`` and compiled again after
wrapping (with default options: pass yours as ``compile={...}``).

The compiled wrapper's ``state_dict()`` keys start with ``_orig_mod.``; ddpkit looks through
it (:func:`uncompiled`) wherever it asks what the model is, and ``unwrap_model`` returns the
user's plain module, so checkpoints hold the plain keys: a compiled and an eager model
resume each other's checkpoints, and ``torch.load(..., weights_only=True)`` +
``load_state_dict`` work on a model that was never compiled.

Example:
    >>> import torch
    >>> model, options = compile_request(torch.nn.Linear(2, 2), False)
    >>> options is None, uncompiled(model) is model
    (True, True)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ddpkit._core.log import logger
from ddpkit.errors import ConfigError


def compile_request(
    model: nn.Module, compile: bool | dict[str, Any]
) -> tuple[nn.Module, dict[str, Any] | None]:
    """The model to wrap (never a compiled one) and the ``torch.compile`` options to apply
    after wrapping (None: do not compile).

    Example:
        >>> compile_request(torch.nn.Linear(2, 2), {"mode": "max-autotune"})[1]
        {'mode': 'max-autotune'}
    """
    if not isinstance(compile, bool | dict):
        raise ConfigError(f"compile must be True, False or a dict of torch.compile options; "
                          f"got {compile!r}")  # fmt: skip
    inner = uncompiled(model)
    if inner is not model:
        logger.info("the model was compiled before prepare_model: compiling it again after "
                    "wrapping, the order DDP and FSDP need")  # fmt: skip
        return inner, dict(compile) if isinstance(compile, dict) else {}
    if compile is False:
        return model, None
    return model, dict(compile) if isinstance(compile, dict) else {}


def compiled(wrapped: nn.Module, options: dict[str, Any] | None) -> nn.Module:
    """``torch.compile(wrapped, **options)``, or ``wrapped`` itself when ``options`` is None.

    Example:
        >>> layer = torch.nn.Linear(2, 2)
        >>> compiled(layer, None) is layer
        True
    """
    if options is None:
        return wrapped
    result: nn.Module = torch.compile(wrapped, **options)  # type: ignore[assignment]
    return result


def uncompiled(model: nn.Module) -> nn.Module:
    """The module inside ``torch.compile``'s wrapper, or ``model`` when not compiled.

    Example:
        >>> layer = torch.nn.Linear(2, 2)
        >>> uncompiled(layer) is layer
        True
    """
    inner = model.__dict__.get("_modules", {}).get("_orig_mod")
    return inner if isinstance(inner, nn.Module) else model
