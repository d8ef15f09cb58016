"""The one command ssh runs on each host of ``ddpkit run --hosts``:
``PYTHON -m ddpkit.launch.remote.entry``, with no argument.

It reads its :class:`~ddpkit.launch.remote.order.HostOrder` from standard input, answers the
probe (the installed versions, the folder, the script, the link to the first host), waits
for ``go``, and then becomes ``ddpkit run`` in the job's folder with the job's environment
(``exec``: the same process, the same standard input, which stays the job's lifeline). The
environment reaches ``ddpkit run`` through ``exec``'s environment, readable by the user
alone (``/proc/PID/environ``), never through a command line. Any login shell runs it: it
is one word and a module name.

It imports no torch (seconds) and nothing of ddpkit's beyond the protocol, so a host
without ddpkit's dependencies still answers what it lacks.

Example::

    python -m ddpkit.launch.remote.entry < order.json   # what each host runs
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from ddpkit._core.protocol import STDIN_LIFELINE_ENV
from ddpkit.launch.remote.order import GO, MAX_ORDER_BYTES, PROBE_ANSWER, HostOrder, Probe


def main() -> int:
    """Answer the probe, then run ``ddpkit run`` once told to go; the exit code otherwise.

    Example::

        sys.exit(main())
    """
    try:
        order = HostOrder.decode(read_line(0))
    except (ValueError, EOFError) as err:
        print(f"ddpkit: {__name__} was given no order it reads ({err})", file=sys.stderr)
        return 2
    found = answer(order)
    print(PROBE_ANSWER + json.dumps(found), flush=True)
    if not found.get("folder"):
        return 2  # nowhere to start: the launcher names the folder and starts no host
    if read_line(0, until_end=True) != GO:
        return 0  # another host was not ready, or the launcher stopped: nothing starts here
    start_ddpkit_run(order)
    return 1  # not reached: exec replaced this process


def read_line(fd: int, until_end: bool = False) -> bytes:
    """One line of ``fd``, read a byte at a time (nothing past it: what follows belongs to
    ``ddpkit run``); EOFError at an end before any byte, unless ``until_end``.

    Example::

        read_line(0)   # b'{"cwd": ...}\\n'
    """
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            if line or until_end:
                break
            raise EOFError("the input ended before an order")
        line += byte
        if len(line) > MAX_ORDER_BYTES:
            raise ValueError(f"no newline within {MAX_ORDER_BYTES} bytes")
    return bytes(line)


def answer(order: HostOrder) -> dict[str, Any]:
    """What this host has of what the job needs, for the launcher's preflight.

    Example::

        answer(order)   # {'ddpkit': '0.9.0', 'torch': '2.13.0', 'folder': True, ...}
    """
    found = _versions()
    try:
        os.chdir(order.cwd)
    except OSError as err:
        return {**found, "folder": False, "folder_error": err.strerror or str(err)}
    found.update(folder=True, script=_has_script(order.probe))
    found.update(_link(order.probe))
    return found


def _versions() -> dict[str, Any]:
    """The installed versions, read without importing torch (seconds)."""
    try:
        return {"ddpkit": version("ddpkit"), "torch": version("torch")}
    except PackageNotFoundError as err:
        return {"error": f"{err} is not installed"}


def _has_script(probe: Probe) -> bool:
    if probe.kind == "module":  # its top package only: importing it would run the user's code
        sys.path.insert(0, os.getcwd())  # as `python -m` finds it, from the job's folder
        return importlib.util.find_spec(probe.script.partition(".")[0]) is not None
    if probe.kind == "program":
        return shutil.which(probe.script) is not None or os.path.exists(probe.script)
    return os.path.exists(probe.script)


def _link(probe: Probe) -> dict[str, bool]:
    """The first host listens on the port until every other host connected to it (as
    ``doctor --nodes`` checks); each other host tries to reach it."""
    deadline = time.monotonic() + probe.link_timeout_s
    if probe.first is not None:
        while time.monotonic() < deadline:
            try:
                socket.create_connection((probe.first, probe.port), 1).close()
                return {"reaches_first": True}
            except OSError:
                time.sleep(0.1)
        return {"reaches_first": False}
    return {"port_free": _listen_for_peers(probe.port, probe.peers, deadline)}


def _listen_for_peers(port: int, peers: int, deadline: float) -> bool:
    """Whether the port was free; if so, held until ``peers`` connected or the deadline."""
    family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
    with socket.socket(family) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store binds
        if family == socket.AF_INET6:
            server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        try:
            server.bind(("", port))
            server.listen()
        except OSError:
            return False
        while peers and time.monotonic() < deadline:
            server.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                server.accept()[0].close()
            except OSError:
                break
            peers -= 1
    return True


def start_ddpkit_run(order: HostOrder) -> None:
    """Become ``ddpkit run`` with the order's arguments and environment (in its folder,
    entered by the probe); its standard input stays the launcher's connection, which it
    watches (``DDPKIT_STDIN_LIFELINE``).

    Example::

        start_ddpkit_run(order)   # never returns
    """
    os.environ.update(order.env)
    os.environ[STDIN_LIFELINE_ENV] = "1"
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "ddpkit", "run", *order.arguments])


if __name__ == "__main__":
    sys.exit(main())
