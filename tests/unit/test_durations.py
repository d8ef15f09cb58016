"""One convention for durations, in the API and on the command line: seconds, and a name that
says what it bounds, not its unit (``_core/renamed.py`` says why). Every public duration is
listed here with its unit; a new one, or one in another unit, fails until it is listed."""

from __future__ import annotations

import argparse
import inspect
import re
import warnings
from typing import Any

import pytest

import ddpkit
import ddpkit.checkpoint
from ddpkit.cli import COMMANDS, command_parser
from ddpkit.errors import ConfigError

# What a duration's name looks like, in Python and as a flag.
DURATION = re.compile(
    r"timeout|interval|period|heartbeat|every_s|flush_every|_ms$|_s$|delay|latency"
)

PYTHON_DURATIONS = {  # name -> unit
    "init.timeout": "s",  # also a timedelta, as torch's init_process_group takes
    "init.join_timeout": "s",
    "init.hang_timeout": "s",
    "ReplicaGroups.timeout": "s",
    "Tracker.flush_every": "s",
    "MLflowLogger.flush_every": "s",
    "WandbLogger.flush_every": "s",
}
# Steps and epochs are counts, not durations: save_every (epochs), check_replicas_every,
# log_every, save_every_steps (steps), ActivationCheckpointing.every (blocks).
COUNTS = {"save_every", "save_every_steps", "check_replicas_every", "log_every", "every"}
NOT_DURATIONS = {"scheduler_interval"}  # "step" or "epoch": when a scheduler steps

# torchrun's own flags, from torch's parser, in seconds; which ones depends on the release
# (--shutdown-timeout is new in torch 2.8).
TORCHRUN_DURATIONS = {"run --monitor-interval", "run --shutdown-timeout"}
CLI_DURATIONS = {  # command flag -> unit (ddpkit's own)
    "run --hang-timeout": "s",
    "verify --timeout": "s",
    "plan --timeout": "s",
    "plan --latency": "s",
    "doctor --timeout": "s",
    "doctor --grace-period": "s",
    "k8s --grace-period": "s",
    "lighthouse --heartbeat-timeout": "s",
    "lighthouse --join-timeout": "s",
}


def _public_callables() -> dict[str, Any]:
    found = {}
    for module, names in ((ddpkit, ddpkit.__all__), (ddpkit.checkpoint, ddpkit.checkpoint.__all__)):
        for name in names:
            value = getattr(module, name)
            if inspect.isclass(value) or inspect.isfunction(value):
                found[name] = value
    return found


def python_durations() -> set[str]:
    found = set()
    for name, value in _public_callables().items():
        try:
            parameters = inspect.signature(value).parameters
        except (TypeError, ValueError):
            continue
        found |= {
            f"{name}.{p}"
            for p in parameters
            if DURATION.search(p) and p not in COUNTS | NOT_DURATIONS
        }
    return found


def cli_durations() -> dict[str, str]:
    """Each shown flag that names a duration, with its metavar."""
    found = {}
    for command in COMMANDS:
        for action in command_parser(command)._actions:
            if action.help == argparse.SUPPRESS:
                continue  # an old spelling, kept a release with a warning
            for flag in action.option_strings:
                if flag.startswith("--") and DURATION.search(flag.replace("-", "_")):
                    found[f"{command} {flag}"] = str(action.metavar or action.dest.upper())
    return found


def test_every_public_duration_parameter_is_listed_with_its_unit() -> None:
    assert python_durations() == set(PYTHON_DURATIONS)
    assert set(PYTHON_DURATIONS.values()) == {"s"}


def test_every_duration_flag_is_listed_and_in_seconds() -> None:
    found = cli_durations()
    underscored = {f for f in found if "_" in f.split(" ", 1)[1]}  # torchrun's second spellings
    shown = {f: m for f, m in found.items() if f not in underscored}
    ours = {f: m for f, m in shown.items() if f not in TORCHRUN_DURATIONS}
    assert set(ours) == set(CLI_DURATIONS)
    assert "run --monitor-interval" in shown  # torchrun's flags are read too
    assert not [flag for flag in found if flag.endswith("-ms")]
    assert set(ours.values()) == {"S"}, ours


def test_an_old_keyword_still_works_for_a_release_with_a_warning_naming_the_new_one() -> None:
    with pytest.warns(FutureWarning, match=r"ReplicaGroups\(timeout_s=...\) is now "
                      r"ReplicaGroups\(timeout=...\)"):  # fmt: skip
        groups = ddpkit.ReplicaGroups(timeout_s=12)
    assert groups.timeout == 12
    with pytest.warns(FutureWarning, match=r"flush_every=\.\.\."):
        tracker = ddpkit.Tracker(flush_every_s=7)
    assert tracker.flush_every == 7
    with pytest.raises(ConfigError, match="got both timeout_s= and timeout="):
        ddpkit.ReplicaGroups(timeout_s=1, timeout=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ddpkit.ReplicaGroups(timeout=3)  # the new spelling says nothing


def test_an_old_flag_in_milliseconds_is_read_as_seconds_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    parser = command_parser("lighthouse")
    with caplog.at_level("WARNING", logger="ddpkit"):
        args = parser.parse_args(["--heartbeat-ms", "2500", "--join-ms", "300"])
    assert (args.heartbeat_timeout, args.join_timeout) == (2.5, 0.3)
    assert "--heartbeat-ms is now --heartbeat-timeout" in caplog.text
    assert "--heartbeat-ms" not in parser.format_help()
