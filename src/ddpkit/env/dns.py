"""Waiting for the master's host name to resolve, with a deadline and one clear message.

On Kubernetes every pod starts at once, but a pod's name in the job's headless service
(``myjob-node-0-0.myjob``) is published only once that pod runs, and cluster DNS caches a
miss for a while: the first lookup of the master's name often fails for seconds. torch treats
that as fatal (``DistNetworkError: ... Name or service not known``, pytorch#73682). So the
launcher and ``ddpkit.init()`` wait for the name first, saying so, up to a deadline
(``DDPKIT_DNS_TIMEOUT``, default 120 s), then stop with the name and what to check.

Example:
    >>> wait_for_name("127.0.0.1", timeout_s=1.0)
    ['127.0.0.1']
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Mapping

from ddpkit._core.envvars import seconds_var
from ddpkit._core.log import logger
from ddpkit._core.protocol import DNS_TIMEOUT_ENV
from ddpkit.errors import RendezvousError

DEFAULT_DNS_TIMEOUT_S = 120.0
_RETRY_S = 1.0  # a cached miss (negative TTL) lasts seconds; asking faster gains nothing
_SAY_EVERY_S = 10.0


def dns_timeout(environ: Mapping[str, str] | None = None) -> float:
    """The deadline for the master's name, from ``DDPKIT_DNS_TIMEOUT`` (seconds; 0: no wait).

    Example:
        >>> dns_timeout({DNS_TIMEOUT_ENV: "30"})
        30.0
    """
    found = seconds_var(DNS_TIMEOUT_ENV, environ)
    return DEFAULT_DNS_TIMEOUT_S if found is None else found


def is_address(host: str) -> bool:
    """True for an IPv4 or IPv6 literal, which needs no lookup.

    Example:
        >>> is_address("10.0.0.1"), is_address("master-0.myjob")
        (True, False)
    """
    try:
        ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return False
    return True


def wait_for_name(
    host: str,
    timeout_s: float | None = None,
    say: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """The addresses ``host`` resolves to, waiting up to ``timeout_s`` for it to resolve.

    ``say`` hears one line when the wait starts, every 10 s after, and when the name
    resolves; past the deadline a :class:`RendezvousError` names the host, the seconds and
    the resolver's last answer.

    Example:
        >>> wait_for_name("localhost", timeout_s=1.0)[0] in ("127.0.0.1", "::1")
        True
    """
    deadline_s = dns_timeout() if timeout_s is None else timeout_s
    tell = say or logger.info
    start = clock()
    last_said = None
    while True:
        addresses, error = _lookup(host)
        waited = clock() - start
        if addresses:
            if last_said is not None:
                tell(f"{host} resolves to {', '.join(addresses)} after {waited:.0f} s")
            return addresses
        if waited >= deadline_s:
            raise RendezvousError(_unresolved(host, deadline_s, error))
        if last_said is None or waited - last_said >= _SAY_EVERY_S:
            tell(f"waiting for {host} to resolve ({error}); {deadline_s - waited:.0f} s left")
            last_said = waited
        time.sleep(min(_RETRY_S, max(0.0, deadline_s - waited)))


def _lookup(host: str) -> tuple[list[str], str]:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        return [], str(err.args[-1] if err.args else err)
    return sorted({str(info[4][0]) for info in infos}), ""


def _unresolved(host: str, deadline_s: float, error: str) -> str:
    return (
        f"{host} not resolvable after {deadline_s:.0f} s: {error}. Check that the name is "
        "the master pod's (or node's) and that its headless service exists (Kubernetes: "
        "spec.network.enableDNSHostnames and publishNotReadyAddresses on a JobSet; the "
        "master pod may still be pending or pulling its image: kubectl get pods). Raise "
        f"{DNS_TIMEOUT_ENV} (seconds) if it only needs longer."
    )
