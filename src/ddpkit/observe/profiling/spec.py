"""Which steps and ranks a profile covers, and how much it records: one frozen value.

``ddpkit run --profile 200-205`` and ``Trainer(..., profile="200-205")`` name the same
window: optimizer steps 200 to 205 (counted from 1, as the step lines count them). Bounded by
default: 5 steps when only the first is given, no Python stacks, no memory, and each rank's
trace cut to :data:`DEFAULT_MAX_MB`.

Example:
    >>> spec = ProfileSpec.parse("200-205", ranks="0,3")
    >>> spec.first, spec.last, spec.ranks, spec.describe()
    (200, 205, (0, 3), 'steps 200-205 on ranks 0,3')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from ddpkit._core.protocol import (
    PROFILE_ENV,
    PROFILE_MAX_MB_ENV,
    PROFILE_MEMORY_ENV,
    PROFILE_RANKS_ENV,
    PROFILE_STACKS_ENV,
)
from ddpkit._core.stepwindow import (
    DEFAULT_MAX_MB,
    RankChoice,
    check_steps,
    parse_ranks,
    parse_steps,
)
from ddpkit.errors import ConfigError


@dataclass(frozen=True)
class ProfileSpec:
    """A window of optimizer steps ``first``..``last`` profiled on ``ranks`` (``"all"``,
    ``"slow"``: the straggler the report names and the median rank, or a tuple of ranks).

    Example:
        >>> ProfileSpec(5, 4)
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: profile window steps 5-4 ends before it starts
    """

    first: int
    last: int
    ranks: RankChoice = "all"
    stacks: bool = False
    memory: bool = False
    max_mb: float = DEFAULT_MAX_MB

    def __post_init__(self) -> None:
        check_steps(self.first, self.last)
        if not self.max_mb > 0:
            raise ConfigError(f"the profile's size cap must be > 0 MB (got {self.max_mb})")

    @classmethod
    def parse(cls, steps: str, ranks: str = "all", **options: object) -> ProfileSpec:
        """From ``"200-205"``, ``"200"`` (5 steps) or ``""``
        (:data:`~ddpkit._core.stepwindow.DEFAULT_STEPS`).

        Example:
            >>> ProfileSpec.parse("40").last
            44
        """
        first, last = parse_steps(steps)
        return cls(first, last, parse_ranks(ranks), **options)  # type: ignore[arg-type]

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> ProfileSpec | None:
        """The window ``ddpkit run --profile`` set for the workers, or None.

        Example:
            >>> ProfileSpec.from_environment({PROFILE_ENV: "3-4"}).describe()
            'steps 3-4 on every rank'
        """
        if PROFILE_ENV not in environ:
            return None
        max_mb = environ.get(PROFILE_MAX_MB_ENV, "")
        try:
            cap = float(max_mb) if max_mb else DEFAULT_MAX_MB
        except ValueError:
            raise ConfigError(f"{PROFILE_MAX_MB_ENV}={max_mb!r} is not a number of MB") from None
        stacks = environ.get(PROFILE_STACKS_ENV, "") == "1"
        memory = environ.get(PROFILE_MEMORY_ENV, "") == "1"
        ranks = environ.get(PROFILE_RANKS_ENV, "all")
        return cls.parse(environ[PROFILE_ENV], ranks, stacks=stacks, memory=memory, max_mb=cap)

    @classmethod
    def of(cls, value: str | ProfileSpec | None) -> ProfileSpec | None:
        """A Trainer's ``profile=`` keyword as a spec (a string is :meth:`parse`'d).

        Example:
            >>> ProfileSpec.of("7-8").first
            7
        """
        if value is None or isinstance(value, ProfileSpec):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        raise ConfigError(
            f"profile must be a window like '200-205' or a ProfileSpec (got {value!r})"
        )

    def steps(self) -> int:
        """How many optimizer steps the window holds."""
        return self.last - self.first + 1

    def moved_to(self, first: int) -> ProfileSpec:
        """The same window (length, ranks, options) starting at step ``first``.

        Example:
            >>> ProfileSpec.parse("10-12").moved_to(31).describe()
            'steps 31-33 on every rank'
        """
        return dataclasses.replace(self, first=first, last=first + self.steps() - 1)

    def describe(self) -> str:
        """``steps 200-205 on every rank`` (the start-up and summary lines)."""
        if self.ranks == "all":
            who = "every rank"
        elif self.ranks == "slow":
            who = "the slow rank and the median rank"
        else:
            who = "ranks " + ",".join(str(rank) for rank in self.ranks)
        return f"steps {self.first}-{self.last} on {who}"
