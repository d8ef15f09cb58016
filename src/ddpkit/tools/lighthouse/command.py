"""``ddpkit lighthouse`` (**experimental**): start the torchft lighthouse that the replica
groups of a fault-tolerant job (``ReplicaGroups``) meet at, and keep it until stopped.

It keeps the list of groups alive (a group silent for ``--heartbeat-timeout`` seconds is
left out of the next step) and starts each step's quorum. It prints the address to give each
group as ``TORCHFT_LIGHTHOUSE``. A group that cannot reach it names it and gives up after its
``timeout``; a short outage is ridden out (``quorum_retries``).

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(); add_arguments(parser)
    >>> parser.parse_args(["--bind", "0.0.0.0:29510"]).min_groups
    1
"""

from __future__ import annotations

import argparse
import signal
import socket
import threading
from typing import Any

from ddpkit._core.log import command_logger
from ddpkit._core.renamed import renamed_flag
from ddpkit._core.validate import check_positive_int, check_seconds
from ddpkit.errors import ConfigError
from ddpkit.faulttolerance.manager import import_torchft

HELP = "start the torchft lighthouse of a fault-tolerant job's replica groups (experimental)"
DESCRIPTION = (
    "Start the torchft lighthouse that the replica groups of a fault-tolerant job "
    "(ReplicaGroups, experimental) meet at, print its address for TORCHFT_LIGHTHOUSE, "
    "and keep it until Ctrl-C or SIGTERM. Needs pip install 'ddpkit[ft]'."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Where it listens and how it judges the groups.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> parser.parse_args([]).bind
        '0.0.0.0:29510'
    """
    flag = parser.add_argument
    flag("--bind", default="0.0.0.0:29510", metavar="HOST:PORT",
         help="where it listens (port 0: a free one; default 0.0.0.0:29510)")  # fmt: skip
    flag("--min-groups", type=int, default=1, metavar="N",
         help="the fewest replica groups a step may be taken with (default 1)")  # fmt: skip
    flag("--heartbeat-timeout", type=float, default=5.0, metavar="S",
         help="seconds a group may be silent before it is left out of the next step "
         "(default 5)")  # fmt: skip
    flag("--join-timeout", type=float, default=1.0, metavar="S",
         help="seconds a new quorum waits for groups still joining (default 1)")  # fmt: skip
    renamed_flag(parser, "--heartbeat-ms", "--heartbeat-timeout", per_unit=0.001, removed_in="0.3")
    renamed_flag(parser, "--join-ms", "--join-timeout", per_unit=0.001, removed_in="0.3")


def main(args: argparse.Namespace) -> int:
    """Serve until stopped; 0 on Ctrl-C or SIGTERM.

    Example::

        main(parser.parse_args(["--bind", "127.0.0.1:0"]))
    """
    check_positive_int("--min-groups", args.min_groups)
    for name in ("heartbeat_timeout", "join_timeout"):
        if check_seconds(f"--{name.replace('_', '-')}", getattr(args, name)) == 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be more than 0 seconds")
    server = _serve(args)
    port = server.address().rsplit(":", 1)[1]
    host = args.bind.rsplit(":", 1)[0].strip("[]")
    shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
    command_logger("lighthouse").info(
        f"lighthouse at http://{shown}:{port} (experimental); start each replica group with "
        f"TORCHFT_LIGHTHOUSE=http://{shown}:{port}; Ctrl-C stops it"
    )
    _wait_for_a_stop()
    server.shutdown()
    return 0


def _serve(args: argparse.Namespace) -> Any:
    import_torchft("ddpkit lighthouse")
    from ddpkit.faulttolerance.heal import serve_lighthouse

    try:
        return serve_lighthouse(
            args.bind, args.min_groups, args.heartbeat_timeout, args.join_timeout
        )
    except RuntimeError as err:
        raise ConfigError(f"the lighthouse cannot listen on {args.bind}: {err}; give another "
                          "--bind (port 0: a free one)") from err  # fmt: skip


def _wait_for_a_stop() -> None:
    stopped = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    while not stopped.wait(1.0):
        pass
