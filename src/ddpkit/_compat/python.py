"""What ddpkit reaches for inside CPython: running the exit handlers and the thread pools'
exit hooks itself, its callers' frames, and ``os._exit`` replaced while a function worker's
script runs.

Example::

    exit_as_python_does()   # after the script, in a worker started from a function
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, NoReturn

from ddpkit._compat import Internal
from ddpkit._core.system import flush_and_exit

EXIT_HANDLERS = Internal(
    "atexit._run_exitfuncs", "python",
    "a worker started from a function ends without running the script's atexit handlers",
)  # fmt: skip
THREAD_EXIT_HOOKS = Internal(
    "threading._threading_atexits", "python",
    "thread pools the script left open are not shut down before its worker ends",
)  # fmt: skip
FRAMES = Internal(
    "sys._getframe", "python", "messages name ddpkit's own line instead of the caller's",
)  # fmt: skip
OS_EXIT = Internal(
    "os._exit, replaced while a function worker's script runs", "python",
    "os._exit(0) in a worker started from a function ends it without a result for torch's "
    "agent, as under torch's own --run-path",
)  # fmt: skip


def exit_as_python_does() -> None:
    """What Python does once the main module ends, before its teardown: stop the thread
    pools (their ``threading`` exit hooks), wait for the non-daemon threads, run the
    ``atexit`` handlers. A function worker does it itself (a forked one ends by
    ``os._exit``), and so does ``ddpkit``'s command before it ends without the teardown.

    Example::

        exit_as_python_does()   # after the script, in a worker started from a function
    """
    THREAD_EXIT_HOOKS.used()
    hooks = getattr(threading, "_threading_atexits", None)
    if hooks is None:
        THREAD_EXIT_HOOKS.gone()
    for hook in reversed(hooks or []):  # executors' shutdown
        hook()
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    EXIT_HANDLERS.used()
    run = getattr(atexit, "_run_exitfuncs", None)
    if run is None:
        EXIT_HANDLERS.gone()
        return
    run()


def exit_without_teardown(code: int) -> NoReturn:
    """End this process with ``code`` as Python would (:func:`exit_as_python_does`, then
    stdout and stderr flushed), skipping the interpreter's teardown. For ddpkit's own
    processes only, whose files are closed when they end, never around a user's script.

    Example::

        exit_without_teardown(main())   # ddpkit's command line, once its command returned
    """
    exit_as_python_does()
    flush_and_exit(code)


def caller_frame(depth: int) -> FrameType | None:
    """The frame ``depth`` calls above the caller (1: the caller's caller); None where the
    interpreter does not give frames.

    Example:
        >>> caller_frame(0).f_code.co_name
        '<module>'
    """
    FRAMES.used()
    getframe = getattr(sys, "_getframe", None)
    if getframe is None:
        FRAMES.gone()
        return None
    try:
        frame: FrameType = getframe(depth + 1)
    except ValueError:  # not that deep
        return None
    return frame


@contextlib.contextmanager
def os_exit_replaced(replacement: Callable[[int], Any]) -> Iterator[Callable[[int], NoReturn]]:
    """``os._exit`` is ``replacement`` inside (for every thread: it is the module's); the
    real one is given to the block, and put back after it.

    Example::

        with os_exit_replaced(exit_) as real_exit: run_script()
    """
    OS_EXIT.used()
    real = os._exit
    os._exit = replacement  # type: ignore[assignment]
    try:
        yield real
    finally:
        os._exit = real
