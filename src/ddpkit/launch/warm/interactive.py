"""``ddpkit.spawn`` from a notebook or a REPL: how a function typed there reaches its workers.

Workers are normally forked from a warm server (:mod:`ddpkit.launch.warm.forkserver`; spawn
where the platform has no forkserver), which imports the function's module and looks the
function up by name. A function typed into ``python -i``, a Jupyter cell or IPython lives
in a ``__main__`` that has no file, so neither can find it. Such a function is sent by
fork instead (as HF Accelerate's ``notebook_launcher`` does): the workers are copies of this
process, the function included. Fork is safe only before CUDA is initialized in this
process (a forked child cannot use the parent's CUDA context), so that case is refused with
what to do.

Example:
    >>> start_method_for(print) in ("forkserver", "spawn")
    True
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ddpkit.errors import ConfigError
from ddpkit.launch.warm.forkserver import warm_start_method


def start_method_for(fn: Callable[..., Any]) -> str:
    """ "fork" for a function defined in an interactive ``__main__``, else the warm method.

    Example:
        >>> def typed_in_a_notebook(): ...
        >>> typed_in_a_notebook.__module__ = "__main__"
        >>> start_method_for(typed_in_a_notebook) in ("fork", "forkserver", "spawn")
        True
    """
    if getattr(fn, "__module__", None) != "__main__" or _main_has_a_file():
        return warm_start_method()
    if _cuda_initialized():
        name = getattr(fn, "__qualname__", repr(fn))
        raise ConfigError(
            f"{name} was defined in an interactive session (a notebook cell or the REPL), "
            "so its workers must be forked from this process, but CUDA is already "
            "initialized here and a forked worker cannot use it. Restart the kernel and "
            "call ddpkit.spawn before anything touches CUDA (model.cuda(), "
            "torch.cuda.device_count() is fine), or move the function into a .py file and "
            "import it"
        )
    return "fork"


def _main_has_a_file() -> bool:
    return getattr(sys.modules.get("__main__"), "__file__", None) is not None


def _cuda_initialized() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())  # type: ignore[no-untyped-call]
