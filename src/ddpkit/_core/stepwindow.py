"""A profiled window's grammar, written once: steps ``FIRST-LAST``, ``FIRST`` (then
:data:`DEFAULT_COUNT` steps) or nothing (:data:`DEFAULT_STEPS`); ranks ``all``, ``slow`` or
``0,3``. Torch-free, so that ``ddpkit run``'s flags refuse a bad window before any worker
starts, with the words the workers' :class:`~ddpkit.observe.profiling.spec.ProfileSpec` uses.

Example:
    >>> parse_steps("200-205"), parse_steps("40"), parse_steps("")
    ((200, 205), (40, 44), (11, 15))
"""

from __future__ import annotations

from ddpkit.errors import ConfigError

DEFAULT_STEPS = "11-15"  # after 10 steps of warm-up (first allocations, caches, DDP buckets)
DEFAULT_COUNT = 5  # steps profiled when only the first is given
DEFAULT_MAX_MB = 20.0  # each rank's trace is cut to this size
RankChoice = str | tuple[int, ...]  # "all", "slow" or the ranks


def parse_steps(text: str) -> tuple[int, int]:
    """The first and last optimizer step (counted from 1) of a window's text.

    Example:
        >>> parse_steps("9-3")
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: profile window steps 9-3 ends before it starts
    """
    first_text, _, last_text = (text.strip() or DEFAULT_STEPS).partition("-")
    try:
        first = int(first_text)
        last = int(last_text) if last_text else first + DEFAULT_COUNT - 1
    except ValueError:
        raise ConfigError(
            f"profile={text!r} is not a window of steps: give FIRST-LAST (e.g. 200-205) "
            f"or FIRST ({DEFAULT_COUNT} steps)"
        ) from None
    check_steps(first, last)
    return first, last


def check_steps(first: int, last: int) -> None:
    """Refuse a window that starts before step 1 or ends before it starts."""
    if first < 1:
        raise ConfigError(f"profile window steps start at 1 (got {first})")
    if last < first:
        raise ConfigError(f"profile window steps {first}-{last} ends before it starts")


def parse_ranks(text: str) -> RankChoice:
    """``"all"``, ``"slow"`` or ``"0,3"`` as the window's ranks.

    Example:
        >>> parse_ranks("1, 0"), parse_ranks("slow")
        ((0, 1), 'slow')
    """
    text = text.strip()
    if text in ("all", "slow"):
        return text
    try:
        ranks = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        ranks = ()
    if not ranks or min(ranks) < 0:
        raise ConfigError(
            f"profile ranks {text!r}: give 'all', 'slow' (the rank the straggler report names) "
            "or ranks like 0,3"
        )
    return ranks
