"""Network preflight checks: socket interface variables, hostname, and the master's port.

These are the troubleshooting list's network items: an interface variable naming an
interface this machine does not have, a hostname other nodes cannot resolve, a master port
already taken (or, on another host, not reachable).

Example:
    >>> check_socket_interfaces({"GLOO_SOCKET_IFNAME": "eth9"}, ["lo", "eth0"]).detail
    'GLOO_SOCKET_IFNAME=eth9 names no interface here (eth9 missing); interfaces: lo, eth0'
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from ddpkit._core.protocol import DEFAULT_MASTER_PORT
from ddpkit._core.system import listening_pid
from ddpkit._core.text import parse_endpoint
from ddpkit.env.initmethod import parse_init_method
from ddpkit.env.kubernetes import detect_pod_job
from ddpkit.errors import ConfigError
from ddpkit.tools.doctor.envinfo import SOCKET_VARS
from ddpkit.tools.doctor.preflight import FAIL, PASS, SKIP, WARN, Check

DEFAULT_MASTER = ("127.0.0.1", DEFAULT_MASTER_PORT)
CONNECT_TIMEOUT_S = 2.5
_LOCAL_ADDR_FIX = (
    "make the name resolve to this node's address on the cluster network (/etc/hosts or "
    "DNS), or pass `ddpkit run --local-addr ADDR` with the address the other nodes reach"
)


@dataclass(frozen=True)
class Endpoint:
    """Where rank 0's store listens, and which setting said so ("from --master", "default").

    Example:
        >>> Endpoint("10.0.0.1", 29500, "from --master").text
        '10.0.0.1:29500'
    """

    host: str
    port: int
    source: str

    @property
    def text(self) -> str:
        """``HOST:PORT`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def master_endpoint(
    master: str | None, init_method: str | None, environ: Mapping[str, str]
) -> Endpoint:
    """--master, else a tcp:// init method, else a Kubernetes controller's node 0, else
    MASTER_ADDR/MASTER_PORT, else 127.0.0.1:29500.

    Example:
        >>> master_endpoint(None, None, {"MASTER_PORT": "1234"})
        Endpoint(host='127.0.0.1', port=1234, source='from MASTER_ADDR/MASTER_PORT')
    """
    if master:
        return Endpoint(*parse_endpoint(master, "--master"), "from --master")
    if init_method and init_method.startswith("tcp://"):
        method = parse_init_method(init_method)
        assert method.host is not None and method.port is not None
        return Endpoint(method.host, method.port, "from --init-method")
    pod = detect_pod_job(environ)
    if pod is not None:  # where `ddpkit run` in this pod will meet the others
        return Endpoint(pod.master_addr, pod.master_port, f"from the {pod.controller.label}")
    if "MASTER_ADDR" in environ or "MASTER_PORT" in environ:
        port = environ.get("MASTER_PORT", str(DEFAULT_MASTER[1]))
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"MASTER_PORT={port!r} is not a TCP port (1..65535)")
        host = environ.get("MASTER_ADDR", DEFAULT_MASTER[0])
        return Endpoint(host, int(port), "from MASTER_ADDR/MASTER_PORT")
    return Endpoint(*DEFAULT_MASTER, "default")


def resolve(host: str) -> list[str]:
    """The addresses ``host`` resolves to (empty when it does not).

    Example:
        >>> "127.0.0.1" in resolve("127.0.0.1")
        True
    """
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    return sorted({str(info[4][0]) for info in infos})


def is_local(addresses: Collection[str], local_addresses: Collection[str]) -> bool:
    """True when any of ``addresses`` is this machine's: loopback, wildcard, or an interface's.

    Example:
        >>> is_local(["127.0.0.1"], []), is_local(["10.0.0.2"], ["10.0.0.1"])
        (True, False)
    """
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])  # fe80::1%eth0: drop the scope
        if ip.is_loopback or ip.is_unspecified or address in local_addresses:
            return True
    return False


def check_master_port(endpoint: Endpoint, local_addresses: Collection[str]) -> Check:
    """This machine's endpoint must be free to bind; another host's should accept a connection.

    Example::

        check_master_port(Endpoint("127.0.0.1", 29500, "default"), []).status   # 'PASS'
    """
    addresses = resolve(endpoint.host)
    if not addresses:
        return Check(
            "master port", FAIL,
            f"{endpoint.host} ({endpoint.source}) does not resolve to an address",
            "use rank 0's IP address, or a name every node resolves (/etc/hosts or DNS)",
        )  # fmt: skip
    if is_local(addresses, local_addresses):
        return _bind_check(endpoint)
    return _connect_check(endpoint)


def _bind_check(endpoint: Endpoint) -> Check:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # A port in TIME_WAIT from an earlier run is free for the store (torch sets the same
        # option), so it must not count as taken; the option also keeps this probe harmless.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", endpoint.port))  # torch's TCPStore listens on every interface
        except OSError as err:
            return _bind_failure(endpoint, err)
    return Check("master port", PASS, f"{endpoint.text} is free ({endpoint.source})")


def _bind_failure(endpoint: Endpoint, err: OSError) -> Check:
    if err.errno != errno.EADDRINUSE:
        detail = f"cannot bind {endpoint.text} ({endpoint.source}): {err.strerror or err}"
        return Check("master port", FAIL, detail, "choose a port above 1023 that is free")
    pid = listening_pid(endpoint.port)
    owner = f" by pid {pid}{_command_of(pid)}" if pid is not None else ""
    stop = f"stop pid {pid}" if pid is not None else "stop the process holding it"
    return Check(
        "master port", FAIL, f"{endpoint.text} is in use{owner} ({endpoint.source})",
        f"{stop}, or choose another port (--master ADDR:PORT, MASTER_PORT)",
    )  # fmt: skip


def _command_of(pid: int) -> str:
    try:
        return f" ({Path(f'/proc/{pid}/comm').read_text().strip()})"
    except OSError:  # gone, or not ours to read
        return ""


def _connect_check(endpoint: Endpoint) -> Check:
    try:
        with socket.create_connection((endpoint.host, endpoint.port), CONNECT_TIMEOUT_S):
            pass
    except OSError as err:
        reason = "timed out" if isinstance(err, TimeoutError) else err.strerror or str(err)
        return Check(
            "master port", WARN,
            f"{endpoint.text} ({endpoint.source}, another host) is not reachable within "
            f"{CONNECT_TIMEOUT_S:g} s: {reason}",
            "start rank 0 first (nothing listens before it does); otherwise check the "
            "firewall between the nodes and that the address is rank 0's as this node sees it",
        )  # fmt: skip
    return Check(
        "master port", PASS, f"{endpoint.text} ({endpoint.source}, another host) is reachable"
    )


def check_socket_interfaces(environ: Mapping[str, str], names: list[str]) -> Check:
    """GLOO_/NCCL_/TP_SOCKET_IFNAME name interfaces that exist here.

    NCCL's forms are understood: ``eth`` (a prefix), ``=eth0`` (exact), ``^docker`` (all but).

    Example:
        >>> check_socket_interfaces({"NCCL_SOCKET_IFNAME": "eth"}, ["lo", "eth0"]).status
        'PASS'
    """
    settings = [(var, environ[var]) for var in SOCKET_VARS if environ.get(var)]
    if not settings:
        return Check("socket interfaces", SKIP, f"none of {', '.join(SOCKET_VARS)} is set")
    if not names:
        return Check("socket interfaces", SKIP, "this platform does not list its interfaces")
    problems = [p for var, value in settings if (p := _interface_problem(var, value, names))]
    shown = ", ".join(f"{var}={value}" for var, value in settings)
    if not problems:
        return Check("socket interfaces", PASS, f"{shown}: present on this machine")
    return Check(
        "socket interfaces", FAIL, f"{'; '.join(problems)}; interfaces: {', '.join(names)}",
        f"set it to one of {', '.join(names)} (the one on the network the ranks share), "
        "or unset it",
    )  # fmt: skip


def _interface_problem(var: str, value: str, names: list[str]) -> str | None:
    spec, exclude, exact = value, False, var != "NCCL_SOCKET_IFNAME"
    if not exact:  # NCCL: "^" excludes, "=" asks for exact names, else names are prefixes
        exclude, spec = spec.startswith("^"), spec.lstrip("^")
        exact, spec = spec.startswith("="), spec.lstrip("=")
    wanted = [entry.strip() for entry in spec.split(",") if entry.strip()]

    def matches(name: str, entry: str) -> bool:
        return name == entry if exact else name.startswith(entry)

    if exclude:
        left = [n for n in names if not any(matches(n, entry) for entry in wanted)]
        return None if left else f"{var}={value} excludes every interface"
    missing = [e for e in wanted if not any(matches(n, e) for n in names)]
    if not missing:
        return None
    return f"{var}={value} names no interface here ({', '.join(missing)} missing)"


def check_hostname(hostname: str, fqdn: str, multi_node: bool) -> Check:
    """The hostname and FQDN resolve (torch's elastic agent advertises the FQDN to other nodes).

    Loopback-only answers are fine on one node and a WARN for a multi-node job.

    Example:
        >>> check_hostname("localhost", "localhost", multi_node=False).status
        'PASS'
    """
    resolved = {name: resolve(name) for name in dict.fromkeys((hostname, fqdn))}
    unresolved = [name for name, addresses in resolved.items() if not addresses]
    names = f"{hostname} (FQDN {fqdn})"
    if unresolved:
        detail = f"{names}: {', '.join(unresolved)} does not resolve to an address"
        return Check("hostname", WARN, detail, _LOCAL_ADDR_FIX)
    addresses = sorted({a for found in resolved.values() for a in found})
    detail = f"{names} resolves to {', '.join(addresses)}"
    if not all(is_loopback(a) for a in addresses):
        return Check("hostname", PASS, detail)
    if multi_node:
        return Check("hostname", WARN, f"{detail}: loopback, unreachable from other nodes",
                     _LOCAL_ADDR_FIX)  # fmt: skip
    return Check("hostname", PASS, f"{detail} (loopback: fine on one node)")


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8 and ::1.

    Example:
        >>> is_loopback("127.0.1.1"), is_loopback("10.0.0.1")
        (True, False)
    """
    return ipaddress.ip_address(address.split("%")[0]).is_loopback
