"""ddpkit's own messages: the ``ddpkit`` logger, from rank 0 by default, as ``ddpkit: ...``.

Library notices (``ddpkit: saved runs/x/epoch_000004.pt``) are INFO records of the ``ddpkit``
logger and go to stdout from rank 0 only, the training loop's epoch and step lines among them
(shown without the prefix: ``epoch 3/10  loss 0.4120  (1.25 s)``); warnings and errors go to
stderr, and those about one rank (a damaged file it read, a hang it saw) are marked
:data:`EVERY_RANK` so each rank says its own. A command's lines come from its own child logger
(``ddpkit.run`` prints ``ddpkit run: ...``) and go to stderr, where they do not mix with a
command's results on stdout. Each record is written to the stream as it is at that moment and
flushed, so launcher logs keep their order and pytest or doctest capture it.

The standard library silences or redirects them, before or after ``ddpkit.init()``::

    logging.getLogger("ddpkit").setLevel(logging.WARNING)       # notices off, warnings kept
    logging.getLogger("ddpkit").handlers = [logging.FileHandler("ddpkit.log")]  # not on screen

Example:
    >>> logger.info("world size 1")
    ddpkit: world size 1
    >>> command_logger("run").warning("2 worker(s) on this node")  # to stderr
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

LOGGER_NAME = "ddpkit"
EVERY_RANK: dict[str, Any] = {"every_rank": True}  # ``extra=`` for a record every rank writes
PLAIN: dict[str, Any] = {"plain": True}  # ``extra=`` for a line shown as it is (epoch lines)

logger = logging.getLogger(LOGGER_NAME)
_rank: int | None = None


def set_rank(rank: int | None) -> None:
    """The rank whose notices are shown (``ddpkit.init`` sets it; None: read ``RANK``).

    Example:
        >>> set_rank(None)
    """
    global _rank
    _rank = rank


def current_rank() -> int:
    """The rank the filter sees: the one set by ``init``, else ``RANK``, else 0.

    Example:
        >>> current_rank() >= 0
        True
    """
    if _rank is not None:
        return _rank
    raw = os.environ.get("RANK", "0")
    return int(raw) if raw.isdigit() else 0


def command_logger(command: str) -> logging.Logger:
    """The logger of a ``ddpkit`` command, whose lines read ``ddpkit COMMAND: ...``.

    Example:
        >>> command_logger("verify").name
        'ddpkit.verify'
    """
    return logging.getLogger(f"{LOGGER_NAME}.{command}")


class _RankZeroFilter(logging.Filter):
    """Rank 0's records, and every rank's records marked :data:`EVERY_RANK`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "every_rank", False) or current_rank() == 0


class _ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Notices of the ``ddpkit`` logger to stdout, the rest to stderr, as they are now."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(_RankZeroFilter())
        self.setFormatter(_PrefixFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        notice = record.name == LOGGER_NAME and record.levelno < logging.WARNING
        # Not setStream(): it flushes the previous stream, which a test may have closed.
        self.stream = sys.stdout if notice else sys.stderr
        super().emit(record)


class _PrefixFormatter(logging.Formatter):
    """``ddpkit: message``, or ``ddpkit run: message`` for the ``ddpkit.run`` logger; a
    :data:`PLAIN` record (the training loop's epoch and step lines) as it is."""

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "plain", False):
            return record.getMessage()
        return f"{record.name.replace('.', ' ')}: {record.getMessage()}"


def _install() -> None:
    # On the logger, not only on our handler: a file handler of the user's gets rank 0's
    # notices too, not every rank's.
    if not any(isinstance(f, _RankZeroFilter) for f in logger.filters):
        logger.addFilter(_RankZeroFilter())
    if logger.level == logging.NOTSET:  # a level the user set before importing us stays
        logger.setLevel(logging.INFO)
    if logger.handlers:  # ours already, or the user's, set before ddpkit's first use: theirs
        return  # stays alone (``import ddpkit`` is lazy: this runs at ``ddpkit.init()``)
    logger.addHandler(_ConsoleHandler())
    logger.propagate = False  # a root handler the user configured would print it twice


_install()
