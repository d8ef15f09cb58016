"""Tracebacks that show the user's frames: torch's, ddpkit's and the import machinery's fold.

A failure deep in a DDP step is thirty frames of torch under the user's one line; a script
that fails at import has runpy's and ddpkit's worker bootstrap on top. The launcher shows the
blamed rank's traceback once, folded this way; ``DDPKIT_FULL_TRACEBACK=1`` keeps every frame.

Example:
    >>> try:
    ...     int("x")
    ... except ValueError as err:
    ...     print(fold_traceback(err).splitlines()[-1])
    ValueError: invalid literal for int() with base 10: 'x'
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from types import TracebackType

from ddpkit._core.protocol import FULL_TRACEBACK_ENV

# Names that say nothing about which call a rank was in: decorators and module plumbing.
_FOLDED = "  [{} frame(s) of torch/ddpkit hidden; " + FULL_TRACEBACK_ENV + "=1 shows them]\n"
_PLUMBING = {"wrapper", "inner", "_fn", "__call__", "_call_impl", "_wrapped_call_impl", "forward"}


def fold_traceback(exc: BaseException, full: bool | None = None) -> str:
    """``exc`` and its chain as Python prints them, with the frames that are not the user's
    folded into one line per run (leading ones dropped).

    Example:
        >>> fold_traceback(ValueError("x"))
        'ValueError: x'
    """
    if full if full is not None else bool(os.environ.get(FULL_TRACEBACK_ENV)):
        return "".join(traceback.format_exception(exc)).rstrip()
    parts: list[str] = []
    _format_chain(exc, parts, seen=set())
    return "".join(parts).rstrip()


def waiting_call(exc: BaseException) -> str | None:
    """The call the user's code was in when ``exc`` came out of torch or ddpkit, as
    ``"all_reduce (train.py:41)"``; None when it was raised in the user's own code.

    Example:
        >>> waiting_call(ValueError("raised by no frame at all")) is None
        True
    """
    frames = traceback.extract_tb(exc.__traceback__)
    users = [i for i, frame in enumerate(frames) if not is_hidden(frame.filename)]
    if not users or users[-1] == len(frames) - 1:
        return None
    caller = frames[users[-1]]
    inside = [f.name for f in frames[users[-1] + 1 :] if f.name not in _PLUMBING]
    name = inside[0] if inside else frames[users[-1] + 1].name
    return f"{name} ({caller.filename}:{caller.lineno})"


def thread_stack(thread_id: int, frames_shown: int = 8) -> list[str]:
    """A thread's Python stack: the caller's own last frames and the innermost one.

    Frames inside torch and ddpkit are left out but for the innermost, so the user's line
    that is waiting stays visible however deep the library call beneath it (the hang report
    shows each rank's stack this way).

    Example:
        >>> import threading
        >>> thread_stack(threading.get_ident())[0].startswith("File ")
        True
    """
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return []
    frames = list(traceback.extract_stack(frame))
    if frames and frames[0].filename == "<string>":  # a warm worker's server: ``python -c``
        frames = frames[1:]
    own = [f for f in frames if not is_hidden(f.filename)][-frames_shown:]
    if frames and (not own or own[-1] is not frames[-1]):
        own.append(frames[-1])
    return [line for f in own for line in (f'File "{f.filename}", line {f.lineno}, in {f.name}',
                                           f"  {f.line}") if line.strip()]  # fmt: skip


def is_hidden(filename: str) -> bool:
    """True for frames that are not the user's: torch, ddpkit, runpy and importlib's, and
    multiprocessing's, which start a warm worker (forked from its server).

    Example:
        >>> is_hidden("<frozen runpy>"), is_hidden("train.py")
        (True, False)
    """
    if filename.startswith("<frozen") or Path(filename).name == "runpy.py":
        return True
    path = Path(filename).resolve()
    return any(path.is_relative_to(folder) for folder in _hidden_folders())


@functools.cache
def _hidden_folders() -> tuple[Path, ...]:
    import multiprocessing

    folders = [Path(__file__).resolve().parent.parent]  # the ddpkit package
    folders.append(Path(multiprocessing.__file__).parent)
    spec = importlib.util.find_spec("torch")  # found without importing it
    if spec is not None and spec.origin:
        folders.append(Path(spec.origin).parent)
    return tuple(folder.resolve() for folder in folders)


def _format_chain(exc: BaseException, parts: list[str], seen: set[int]) -> None:
    seen.add(id(exc))
    cause, context = exc.__cause__, exc.__context__
    if cause is not None and id(cause) not in seen:
        _format_chain(cause, parts, seen)
        parts.append("\nThe above exception was the direct cause of the following exception:\n\n")
    elif context is not None and not exc.__suppress_context__ and id(context) not in seen:
        _format_chain(context, parts, seen)
        parts.append("\nDuring handling of the above exception, another exception occurred:\n\n")
    parts.extend(_folded_frames(exc.__traceback__))
    parts.extend(traceback.format_exception_only(exc))


def _folded_frames(tb: TracebackType | None) -> list[str]:
    frames = traceback.extract_tb(tb)
    while frames and is_hidden(frames[0].filename):  # the bootstrap above the user's code
        frames.pop(0)
    if not frames:
        return []
    lines = ["Traceback (most recent call last):\n"]
    run: list[traceback.FrameSummary] = []
    for frame in [*frames, None]:
        if frame is not None and is_hidden(frame.filename):
            run.append(frame)
            continue
        if run:
            lines.append(_FOLDED.format(len(run)))
            run = []
        if frame is not None:
            lines.extend(traceback.StackSummary.from_list([frame]).format())
    return lines
