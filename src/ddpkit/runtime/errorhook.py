"""An uncaught ddpkit error ends a script with the user's line and the message, not our stack.

Every error ddpkit raises on purpose (:class:`~ddpkit.errors.DdpkitError`) already says what
was wrong and how to fix it; the twenty frames of ddpkit's internals above it only bury that
sentence, most of all in a job's output file. ``ddpkit.init()`` installs this hook first
thing. Other exceptions keep Python's full traceback, and ``DDPKIT_FULL_TRACEBACK=1`` restores
it for ddpkit's errors too.

Example:
    >>> from ddpkit.errors import ConfigError
    >>> print(short_report(ConfigError("--nproc must be >= 1 (got 0)"), None))
    ddpkit.errors.ConfigError: --nproc must be >= 1 (got 0)
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from types import TracebackType

from ddpkit._core.protocol import FULL_TRACEBACK_ENV
from ddpkit.errors import DdpkitError

_PACKAGE = Path(__file__).resolve().parent.parent  # the ddpkit package


def install_short_errors() -> None:
    """Make uncaught ddpkit errors print :func:`short_report`; idempotent.

    Example:
        >>> install_short_errors()
    """
    if os.environ.get(FULL_TRACEBACK_ENV) or getattr(sys.excepthook, "_ddpkit_short", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if isinstance(exc, DdpkitError):
            print(short_report(exc, tb), file=sys.stderr, flush=True)
        else:
            previous(kind, exc, tb)

    hook._ddpkit_short = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def short_report(exc: BaseException, tb: TracebackType | None) -> str:
    """The user's frame that called into ddpkit, then the error's type and message.

    Example:
        >>> short_report(ValueError("x"), None)
        'ValueError: x'
    """
    kind = type(exc)
    module = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
    lines = [f"{module}{kind.__qualname__}: {exc}"]
    caller = _last_user_frame(tb)
    if caller is not None:
        where = f'  File "{caller.filename}", line {caller.lineno}, in {caller.name}'
        lines[:0] = [where, f"    {(caller.line or '').strip()}"]
        lines.append(f"(ddpkit's own frames are hidden; {FULL_TRACEBACK_ENV}=1 shows them)")
    return "\n".join(lines)


def _last_user_frame(tb: TracebackType | None) -> traceback.FrameSummary | None:
    outside = [
        frame
        for frame in traceback.extract_tb(tb)
        if not Path(frame.filename).resolve().is_relative_to(_PACKAGE)
    ]
    return outside[-1] if outside else None
