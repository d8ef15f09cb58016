"""Python's own start-up and ending costs, cut for the processes ddpkit runs itself.

Importing torch makes a few hundred thousand objects and no garbage, yet the cyclic
collector, woken every few hundred allocations, walks them again and again: 0.45 s of a
1.7 s import of torch, torch._dynamo and ddpkit on this 2-core machine (1.23 s with the
collector paused). At the end, an interpreter that imported torch frees every module's
objects one by one before it exits: 0.3-0.4 s in which the job is over and the caller
still waits. ``ddpkit``'s command pauses the collector while it imports torch
(:func:`collector_paused`) and ends without that teardown
(:func:`ddpkit._compat.python.exit_without_teardown`: it runs CPython's exit handlers itself).
A user's script keeps Python's ending: its unclosed files are flushed by that teardown.

Example:
    >>> import gc
    >>> with collector_paused():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside (reference counting still frees objects),
    back as it was after: around imports, which make objects but no cycles to collect.

    Example:
        >>> with collector_paused():
        ...     import json
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
