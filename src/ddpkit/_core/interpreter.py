"""Python's own start-up and ending costs, cut for the processes ddpkit runs itself.

Importing torch makes a few hundred thousand objects and no garbage, yet the cyclic
collector, woken every few hundred allocations, walks them again and again: 0.45 s of a
1.7 s import of torch, torch._dynamo and ddpkit on this 2-core machine (1.23 s with the
collector paused). At the end, an interpreter that imported torch frees every module's
objects one by one before it exits: 0.3-0.4 s in which the job is over and the caller
still waits. ``ddpkit``'s command pauses the collector while it imports torch
(:func:`collector_paused`) and ends without that teardown (:func:`exit_without_teardown`).
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

import atexit
import contextlib
import gc
import threading
from collections.abc import Iterator
from typing import NoReturn

from ddpkit._core.system import flush_and_exit


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


def exit_as_python_does() -> None:
    """What Python does once the main module ends, before its teardown: stop the thread
    pools (their ``threading`` exit hooks), wait for the non-daemon threads, run the
    ``atexit`` handlers. A function worker does it itself (a forked one ends by
    ``os._exit``), and so does ``ddpkit``'s command before it ends without the teardown.

    Example::

        exit_as_python_does()   # after the script, in a worker started from a function
    """
    for hook in reversed(getattr(threading, "_threading_atexits", [])):  # executors' shutdown
        hook()
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()


def exit_without_teardown(code: int) -> NoReturn:
    """End this process with ``code`` as Python would (:func:`exit_as_python_does`, then
    stdout and stderr flushed), skipping the interpreter's teardown. For ddpkit's own
    processes only, whose files are closed when they end, never around a user's script.

    Example::

        exit_without_teardown(main())   # ddpkit's command line, once its command returned
    """
    exit_as_python_does()
    flush_and_exit(code)
