"""``ddpkit run``'s profiling flags, passed to every worker as its environment.

The workers' training loop reads them (:mod:`ddpkit.observe.profiling.spec`); only the window's
form is checked here, so a typo fails before any worker starts.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(); add_profile_arguments(parser)
    >>> settings = profile_settings(
    ...     parser.parse_args(["--profile", "200-205", "--profile-ranks", "slow"]))
    >>> settings == {PROFILE_ENV: "200-205", PROFILE_RANKS_ENV: "slow"}
    True
"""

from __future__ import annotations

import argparse
import os

from ddpkit._core.protocol import (
    PROFILE_DIR_ENV,
    PROFILE_ENV,
    PROFILE_MAX_MB_ENV,
    PROFILE_MEMORY_ENV,
    PROFILE_RANKS_ENV,
    PROFILE_STACKS_ENV,
)
from ddpkit._core.stepwindow import (
    DEFAULT_COUNT,
    DEFAULT_MAX_MB,
    DEFAULT_STEPS,
    parse_ranks,
    parse_steps,
)
from ddpkit.errors import ConfigError


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``profiling`` group: ``--profile [STEPS]``, ``--profile-ranks``, ``--profile-stacks``,
    ``--profile-memory``, ``--profile-max-mb``, ``--profile-dir``."""
    group = parser.add_argument_group("profiling (docs/slow-jobs.md)")
    group.add_argument(
        "--profile", nargs="?", const="", default=None, type=_window, metavar="STEPS",
        help=f"profile optimizer steps FIRST-LAST (e.g. 200-205; FIRST alone: {DEFAULT_COUNT} "
        f"steps; no value: {DEFAULT_STEPS}) with torch.profiler on every rank: one merged "
        "timeline and a summary",
    )  # fmt: skip
    group.add_argument(
        "--profile-ranks", type=_ranks, default=None, metavar="RANKS",
        help="all (default), slow (the rank the straggler report names, and the median rank), "
        "or ranks like 0,3",
    )  # fmt: skip
    group.add_argument(
        "--profile-stacks", action="store_true",
        help="record Python stacks and calls too (names the Python code a step spends time "
        "in; traces grow several times)",
    )  # fmt: skip
    group.add_argument(
        "--profile-memory", action="store_true",
        help="record tensor allocations and frees too (Perfetto's memory counters)",
    )  # fmt: skip
    group.add_argument(
        "--profile-max-mb", type=float, default=None, metavar="MB",
        help=f"cut each rank's trace to this size, shortest events first (default "
        f"{DEFAULT_MAX_MB:g})",
    )  # fmt: skip
    group.add_argument(
        "--profile-dir", default=None, metavar="DIR",
        help="where profiles go, and where a file named 'request' asks the running job for "
        "one (default ./ddpkit-profile)",
    )  # fmt: skip


def profile_settings(args: argparse.Namespace) -> dict[str, str]:
    """The workers' environment the profiling flags ask for (none: an empty dict)."""
    settings = {}
    if args.profile is not None:
        settings[PROFILE_ENV] = args.profile
    if args.profile_ranks is not None:
        settings[PROFILE_RANKS_ENV] = args.profile_ranks
    if args.profile_stacks:
        settings[PROFILE_STACKS_ENV] = "1"
    if args.profile_memory:
        settings[PROFILE_MEMORY_ENV] = "1"
    if args.profile_max_mb is not None:
        settings[PROFILE_MAX_MB_ENV] = str(args.profile_max_mb)
    if args.profile_dir is not None:
        settings[PROFILE_DIR_ENV] = os.path.abspath(args.profile_dir)
    return settings


def _window(text: str) -> str:
    if text.endswith(".py") or (text and os.path.exists(text)):  # `--profile train.py`
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a window of steps: the script came right after --profile: write "
            f"--profile {DEFAULT_STEPS} {text}, or put another flag between them"
        )
    try:
        parse_steps(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text.strip()


def _ranks(text: str) -> str:
    try:
        parse_ranks(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text.replace(" ", "")
