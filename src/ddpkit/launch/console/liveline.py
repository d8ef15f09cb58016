"""The one line the merged console redraws: a rank's line still being drawn (a progress bar).

A worker that redraws a line with ``\\r`` (tqdm, a hand-made progress printer) has not ended
it yet, so it is no line the merger could print. :class:`LiveLine` shows its newest state
as it goes, with the rank's prefix, at most every ``interval`` seconds. In a terminal it is
redrawn in place and put back under the lines printed meanwhile (as ``tqdm.write`` does);
in a pipe each state is a ``\\r``-led rewrite of the same line, as a worker writing to the
pipe itself would leave it, cleared before the next whole line.

Example:
    >>> import io
    >>> out = io.StringIO()
    >>> live = LiveLine(out, terminal=False, interval=0.0)
    >>> live.show("[rank0] 50%|#####     | 5/10", now=1.0)
    >>> live.clear()  # a whole line comes next
    >>> out.getvalue().split("\\r")
    ['', '[rank0] 50%|#####     | 5/10', '                             ', '']
"""

from __future__ import annotations

import shutil
from typing import IO

TERMINAL_INTERVAL_S = 0.1  # as tqdm's own mininterval: a terminal redraws smoothly
PIPE_INTERVAL_S = 0.5  # a log file or CI page gets two states a second, not one per poll
_ERASE = "\r\x1b[K"  # back to the line's start, erase it


class LiveLine:
    """Draws one changing line on ``stream``; ``terminal`` decides how it is rewritten.

    Example::

        live = LiveLine(sys.stdout, terminal=sys.stdout.isatty())
        live.show("[rank0] epoch 1:  25%|##5       | 5/20", now=time.monotonic())
    """

    def __init__(self, stream: IO[str], terminal: bool, interval: float | None = None) -> None:
        self.stream, self.terminal = stream, terminal
        default = TERMINAL_INTERVAL_S if terminal else PIPE_INTERVAL_S
        self.interval = default if interval is None else interval
        self._text = ""  # what the line shows now ("": nothing drawn)
        self._last = ""  # the last state drawn, cleared since or not
        self._width = 0  # how much of the line a pipe's states covered since it was cleared
        self._drawn_at = float("-inf")

    @classmethod
    def on(cls, stream: IO[str]) -> LiveLine:
        """A live line on ``stream``, redrawn in place when it is a terminal."""
        isatty = getattr(stream, "isatty", None)
        return cls(stream, terminal=bool(isatty and isatty()))

    def show(self, text: str, now: float) -> None:
        """Show ``text`` (``""``: nothing) as the line's state. A state replaces the one
        drawn at most every ``interval`` seconds (the caller offers it again later); on a
        cleared line a terminal gets the state back at once, a pipe only a new one."""
        if text == self._text or (self._text and now - self._drawn_at < self.interval):
            return
        if not self._text and not self.terminal and text == self._last:
            return
        self._draw(text)
        self._drawn_at = now

    def clear(self) -> None:
        """Take the line away before whole lines are printed in its place."""
        if self._text:
            self._erase()
            self._text = ""

    def _draw(self, text: str) -> None:
        if not text:
            self.clear()
        elif self.terminal:
            self.stream.write(_ERASE + _fit(text))
        else:  # spaces cover a longer earlier state when the log is shown in a terminal
            self.stream.write("\r" + text + " " * (self._width - len(text)))
            self._width = max(self._width, len(text))
        self._text = self._last = text
        self.stream.flush()

    def _erase(self) -> None:
        if self.terminal:
            self.stream.write(_ERASE)
        else:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0
        self.stream.flush()


def _fit(text: str) -> str:
    # A line wider than the terminal wraps, and "\r" then redraws only its last part.
    width = shutil.get_terminal_size().columns - 1
    return text if len(text) <= width else text[: max(width - 1, 1)] + "…"
