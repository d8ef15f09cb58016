"""Look-ups on this machine, and leaving the process: cores, loopback, ports, exit.

Example:
    >>> usable_cores() >= 1
    True
"""

from __future__ import annotations

import os
import socket
import struct
import sys
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def usable_cores(cgroup_root: str = "/sys/fs/cgroup") -> int:
    """Cores this process may run on: its CPU affinity (SLURM, taskset), or less where its
    cgroup's CPU quota is smaller (a container or pod's CPU limit, ``cpu.max``).

    A pod limited to 4 CPUs on a 64-core node sees 64 cores; 64 threads would then share
    4 cores' worth of time, each throttled in turn.

    Example:
        >>> usable_cores() <= (os.cpu_count() or 1)
        True
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = cpu_quota(cgroup_root)
    return max(1, min(cores, quota)) if quota is not None else cores


def threads_per_worker(nproc: int) -> int:
    """Each of ``nproc`` workers' share of the usable cores (at least 1): their
    ``OMP_NUM_THREADS`` default, as oversubscribed threads make CPU training slower.

    Example:
        >>> threads_per_worker(usable_cores()) == 1
        True
    """
    return max(1, usable_cores() // max(1, nproc))


def cpu_quota(cgroup_root: str = "/sys/fs/cgroup", membership: str | None = None) -> int | None:
    """This process's cgroup CPU limit in whole cores, rounded up; None if unlimited.

    Reads cgroup v2's ``cpu.max``, else v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``,
    in the cgroup ``/proc/self/cgroup`` (``membership``) names.

    Example:
        >>> cpu_quota("/nonexistent") is None
        True
    """
    try:
        lines = membership if membership is not None else Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    for line in lines.strip().splitlines():
        _, controllers, path = line.split(":", 2)
        limit = _v2_limit(cgroup_root, path) if controllers == "" else None
        if limit is None and "cpu" in controllers.split(","):
            limit = _v1_limit(cgroup_root, controllers, path)
        if limit is not None:
            return max(1, -(-limit[0] // limit[1]))
    return None


def _v2_limit(root: str, path: str) -> tuple[int, int] | None:
    return _numbers(Path(root, path.lstrip("/"), "cpu.max"))


def _v1_limit(root: str, controllers: str, path: str) -> tuple[int, int] | None:
    folder = Path(root, controllers, path.lstrip("/"))
    quota, period = _numbers(folder / "cpu.cfs_quota_us"), _numbers(folder / "cpu.cfs_period_us")
    return (quota[0], period[0]) if quota and period else None


def _numbers(path: Path) -> tuple[int, int] | None:
    """The positive numbers a limit file holds ("400000 100000", or one), None for none."""
    try:
        words = path.read_text().split()
    except OSError:
        return None
    if not words or not all(w.isdigit() and int(w) > 0 for w in words):
        return None  # "max", "-1": no limit
    numbers = [int(w) for w in words]
    return (numbers[0], numbers[-1])


def interface_names() -> list[str]:
    """This machine's network interfaces (empty when the OS will not tell).

    Example:
        >>> isinstance(interface_names(), list)
        True
    """
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:
        return []


def loopback_interface() -> str | None:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS), if there is one.

    Example:
        >>> loopback_interface() in ("lo", "lo0", None)
        True
    """
    names = interface_names()
    return next((n for n in ("lo", "lo0") if n in names), None)


def interface_ipv4(name: str) -> str | None:
    """The IPv4 address of interface ``name``, asked of the kernel (Linux only).

    Example:
        >>> interface_ipv4("lo") in ("127.0.0.1", None)
        True
    """
    if not sys.platform.startswith("linux"):
        return None
    import fcntl  # not on Windows; imported here so the module loads everywhere

    request = struct.pack("256s", name.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            reply = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
        except OSError:  # the interface has no IPv4 address (or vanished)
            return None
    return socket.inet_ntoa(reply[20:24])


def listening_socket(host: str) -> tuple[int, int]:
    """A TCP socket listening on ``host`` alone, on a port the OS picks at bind time (no
    find-then-bind race): its file descriptor, for ``TCPStore(master_listen_fd=...)``, which
    would otherwise listen on every interface, and its port.

    Example:
        >>> fd, port = listening_socket("127.0.0.1"); os.close(fd); port > 0
        True
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen()
    except OSError:
        sock.close()
        raise
    port = int(sock.getsockname()[1])
    return sock.detach(), port


def host_of(address: str) -> str:
    """The host part of a server's address, ``http://HOST:PORT`` or ``HOST:PORT``.

    Example:
        >>> host_of("http://10.0.0.9:29510"), host_of("beacon:29510")
        ('10.0.0.9', 'beacon')
    """
    return urlsplit(address if "://" in address else f"http://{address}").hostname or ""


def interface_toward(address: str) -> str | None:
    """The interface this machine reaches the server at ``address`` (``http://HOST:PORT`` or
    ``HOST:PORT``) over; None where that is loopback, or no address, or the kernel will not
    say.

    Example:
        >>> interface_toward("http://127.0.0.1:29510") is None
        True
    """
    if not address:
        return None
    local, interface = route_to(host_of(address))
    return None if local == "?" or local.startswith("127.") else interface


def route_to(host: str) -> tuple[str, str | None]:
    """The local address this machine reaches ``host`` from, and its interface's name
    (None where the kernel will not say): where traffic to that host really goes.

    Example:
        >>> route_to("127.0.0.1")[0]
        '127.0.0.1'
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))  # UDP: nothing is sent; the kernel picks the route
            local = str(probe.getsockname()[0])
    except OSError:
        return "?", None
    named = (name for name in interface_names() if interface_ipv4(name) == local)
    return local, next(named, None)


def flush_and_exit(code: int) -> NoReturn:
    """Flush stdout and stderr, then end the process at once with ``code``.

    ``os._exit`` skips the user's code after the call (more training, evaluation) and
    atexit handlers: for a job told to stop, every rank leaves at the same point.

    Example::

        flush_and_exit(75)   # after the preemption checkpoint is written
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def listening_pid(port: int) -> int | None:
    """The pid of a local process listening on TCP ``port``, where Linux's /proc tells.

    Example:
        >>> listening_pid(1) is None
        True
    """
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    for proc in Path("/proc").glob("[0-9]*"):
        if targets & _fd_links(proc):
            return int(proc.name)
    return None


def _fd_links(proc: Path) -> set[str]:
    links: set[str] = set()
    try:
        fds = list((proc / "fd").iterdir())
    except OSError:  # the process is gone, or not ours to read
        return links
    for fd in fds:
        try:
            links.add(os.readlink(fd))
        except OSError:  # closed while we looked (the listing's own fd, for one)
            continue
    return links


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local address is hex "ADDR:PORT"; state 0A is LISTEN
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                inodes.add(fields[9])
    return inodes
