"""**Experimental.** Where the replica groups meet each other: the address a group is reached
at, the store through which torchft sets up the process group between the groups, and a check
that gloo's traffic can leave the host.

At each new quorum torchft hands every group one group's store address, and the process
group between the groups is set up through that store; the exchange then runs over gloo's
interface. A group that ``ddpkit run`` started on one node has its own store on loopback
(``ddpkit.launch.loopback``) and gloo on loopback too (GLOO_SOCKET_IFNAME): right for the
group's own ranks, out of reach for a group on another host (tried on two network-namespace
hosts: the groups never met, "wait timeout after 60000ms"). So the groups meet at an address
of their own, the one this host reaches the lighthouse from (:func:`meeting_address`; with
every group on one host, loopback still): rank 0 of each group hosts a store bound there
alone (:func:`exchange_store`), ``ddpkit run`` puts gloo on that address's interface when
the lighthouse is elsewhere, and :func:`check_gloo_interface` names a setting that keeps
gloo where the other groups cannot reach it.

Example::

    address = meeting_address("http://10.0.0.9:29510")      # '10.0.0.4', this host's eth0
    store, port = exchange_store(world, address, timedelta(seconds=30))
"""

from __future__ import annotations

import ipaddress
import os
import socket
from datetime import timedelta

import torch
from torch.distributed import TCPStore

from ddpkit._core.system import host_of, listening_socket, route_to
from ddpkit._core.torchversion import torch_at_least
from ddpkit.env.world import World
from ddpkit.errors import ConfigError
from ddpkit.runtime.collectives import broadcast_from_main

GLOO_INTERFACE_ENV = "GLOO_SOCKET_IFNAME"  # torch's own name: the interfaces gloo uses
# Before torch 2.8 the libuv server cannot adopt a listening socket (master_listen_fd).
_LIBUV_OPTION = {} if torch_at_least("2.8") else {"use_libuv": False}


def meeting_address(lighthouse: str) -> str:
    """The address this host reaches the lighthouse from: where the other groups reach this
    one (on one host, loopback).

    Example:
        >>> meeting_address("http://127.0.0.1:29510")
        '127.0.0.1'
    """
    host = host_of(lighthouse)
    local, _ = route_to(host)
    if local == "?":
        raise ConfigError(f"this host has no route to the lighthouse at {lighthouse} ({host!r}): "
                          "give the lighthouse's address as the groups reach it, "
                          "http://HOST:PORT (TORCHFT_LIGHTHOUSE)")  # fmt: skip
    return local


def is_loopback(address: str) -> bool:
    """Whether ``address`` is a loopback address.

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("10.0.0.4")
        (True, False)
    """
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def exchange_store(world: World, address: str, timeout: timedelta) -> tuple[TCPStore | None, int]:
    """This group's store for the process group between the groups, listening on ``address``
    alone: hosted by the group's rank 0 (the store, kept alive with the group), its port told
    to the group's other ranks (None and the port there).

    Example::

        store, port = exchange_store(world, "10.0.0.4", timedelta(seconds=30))
    """
    store, port = None, 0
    if world.rank == 0:
        listening, port = listening_socket(address)
        store = TCPStore(address, port, None, True, timeout, wait_for_workers=False,
                         master_listen_fd=listening, **_LIBUV_OPTION)  # fmt: skip
    # The group's ranks all reach rank 0's store at rank 0's meeting address
    told = broadcast_from_main(torch.tensor([port], dtype=torch.int64))
    return store, int(told.item())


def check_gloo_interface(lighthouse: str, address: str) -> None:
    """A ConfigError where gloo's traffic would stay on this host while the lighthouse (and
    so the other groups) is elsewhere: GLOO_SOCKET_IFNAME set to interfaces that do not
    reach it, or unset with this host's name resolving to loopback (gloo's default).

    Example:
        >>> check_gloo_interface("http://127.0.0.1:29510", "127.0.0.1")  # one host: any
    """
    if is_loopback(address):
        return
    _, toward = route_to(host_of(lighthouse))
    chosen = os.environ.get(GLOO_INTERFACE_ENV)
    fix = f"set {GLOO_INTERFACE_ENV}={toward}" if toward else f"unset {GLOO_INTERFACE_ENV}"
    if chosen and toward not in chosen.split(","):
        raise ConfigError(f"{GLOO_INTERFACE_ENV}={chosen} keeps gloo off the interface this host "
                          f"reaches the lighthouse at {lighthouse} over ({toward or address}): "
                          f"the other replica groups could not reach this one; {fix} "
                          "(ddpkit run does when it sees TORCHFT_LIGHTHOUSE)")  # fmt: skip
    if not chosen and is_loopback(_resolved(socket.gethostname())):
        interface = toward or "the interface toward them"
        raise ConfigError(f"gloo would bind this host's name, {socket.gethostname()}, which "
                          f"resolves to loopback, while the lighthouse is at {lighthouse}: the "
                          "other replica groups could not reach this one; "
                          f"set {GLOO_INTERFACE_ENV}={interface}")  # fmt: skip


def _resolved(name: str) -> str:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return "?"
