"""The machines of a job without a scheduler: ``--hosts a:4,b:4`` or a hostfile.

A hostfile is one host per line in any of the forms other launchers read: DeepSpeed's and
Open MPI's ``host slots=N``, MPICH's ``host:N``, a bare ``host``; ``#`` starts a comment.
Each host name may be a SLURM node list (``gpu[01-04]``), whose hosts get its slots. A host
without slots runs ``--nproc`` workers. ``user@host`` is passed to ssh as it is; an IPv6
address is written in brackets where slots follow it (``[fd00::2]:4``).

Every host is checked before ssh sees it: a host name (letters, digits, ``-``, ``_``, ``.``),
an IPv4 or IPv6 address, each with an optional ``user@``; nothing that starts with ``-``, so
that no entry can become one of ssh's options (``-oProxyCommand=...``).

Example:
    >>> [str(h) for h in parse_hosts("gpu[01-02]:4,login")]
    ['gpu01:4', 'gpu02:4', 'login']
    >>> [str(h) for h in read_hostfile("a slots=2  # first\\nb:2\\nc\\n")]
    ['a:2', 'b:2', 'c']
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from ddpkit.env.hostlist import expand_hostlist, split_hostlist
from ddpkit.errors import ConfigError

_SLOTS = re.compile(r"^slots=(\d+)$")
_MAX_SLOTS = re.compile(r"^max[-_]slots=\d+$")  # Open MPI's upper bound: nothing to start
# A host name's labels (RFC 1123, plus "_" that ssh aliases and some clusters use) and a
# login name (POSIX's portable set): neither may start with "-", ssh's option marker.
_HOST_NAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
# An IPv6 address in brackets, its slots after them: [fd00::2]:4, me@[fd00::2]
_BRACKETED_V6 = re.compile(
    r"^(?P<user>[^@\[\]]+@)?\[(?P<address>[^\[\]]*:[^\[\]]*)\](?::(?P<slots>.*))?$"
)
HOST_FORMS = (
    "a host is a name (gpu01, node-1.cluster), an IPv4 or IPv6 address, or user@host, "
    "and does not start with '-'"
)


@dataclass(frozen=True)
class Host:
    """One machine of the job: the name ssh reaches it by, and its workers (None: --nproc).

    Example:
        >>> str(Host("gpu01", 4)), Host("gpu01").workers(default="8")
        ('gpu01:4', '8')
    """

    name: str
    slots: int | None = None

    def __str__(self) -> str:
        return self.name if self.slots is None else f"{self.name}:{self.slots}"

    def workers(self, default: str) -> str:
        """Its workers: its slots, else ``default`` (``--nproc``, resolved on the host)."""
        return default if self.slots is None else str(self.slots)

    @property
    def address(self) -> str:
        """The host name without ``user@``: where its ports are.

        Example:
            >>> Host("me@gpu01").address
            'gpu01'
        """
        return self.name.rpartition("@")[2]

    @property
    def endpoint_host(self) -> str:
        """The address as an ``ADDR:PORT`` endpoint writes it: an IPv6 one in brackets.

        Example:
            >>> Host("fd00::2").endpoint_host, Host("gpu01").endpoint_host
            ('[fd00::2]', 'gpu01')
        """
        return f"[{self.address}]" if ":" in self.address else self.address


def parse_hosts(spec: str) -> list[Host]:
    """``--hosts``: comma-separated ``HOST[:SLOTS]``, each HOST possibly a SLURM node list.

    Example:
        >>> parse_hosts("a:2,b:2")
        [Host(name='a', slots=2), Host(name='b', slots=2)]
    """
    hosts = [host for item in split_hostlist(spec) for host in _entry(item, "--hosts", spec)]
    return _checked(hosts, f"--hosts {spec}")


def read_hostfile(text: str, source: str = "hostfile") -> list[Host]:
    """The hosts of a hostfile's ``text`` (``source`` names it in errors).

    Example:
        >>> read_hostfile("n[1-2] slots=4 max_slots=8")
        [Host(name='n1', slots=4), Host(name='n2', slots=4)]
    """
    hosts: list[Host] = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if words:
            where = f"{source} line {number}"
            hosts.extend(_entry(words[0], where, line, _slots_word(words[1:], where)))
    return _checked(hosts, source)


def load_hostfile(path: str) -> list[Host]:
    """:func:`read_hostfile` of the file at ``path``, with a clear error if it cannot be read.

    Example::

        load_hostfile("hosts.txt")
    """
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"--hostfile {path}: cannot be read ({err.strerror})") from None
    return read_hostfile(text, f"--hostfile {path}")


def check_host_name(name: str, where: str) -> str:
    """``name`` if ssh can only read it as a host: ``[user@]host``, the host a name, an IPv4
    or an IPv6 address; else a ConfigError naming it (``where``: the flag or file line).

    Example:
        >>> check_host_name("me@gpu01", "--hosts")
        'me@gpu01'
        >>> check_host_name("-oProxyCommand=/tmp/x.sh", "--hosts")
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: --hosts: '-oProxyCommand=/tmp/x.sh' is not a host: a host ...
    """
    user, at, host = name.rpartition("@")
    if (at and not _USER.match(user)) or not _is_host(host):
        raise ConfigError(f"{where}: {name!r} is not a host: {HOST_FORMS}")
    return name


def _is_host(host: str) -> bool:
    if _HOST_NAME.match(host) and not host.startswith("-"):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _entry(item: str, where: str, text: str, slots: int | None = None) -> list[Host]:
    """``HOST[:SLOTS]`` (HOST a node list), or HOST with ``slots`` given apart."""
    v6 = _BRACKETED_V6.match(item)
    if v6:  # the address's own colons are not a count's
        given = v6["slots"]
        workers = _count(given or "", given is not None, slots, where, text)
        return _hosts([f"{v6['user'] or ''}{v6['address']}"], where, text, workers)
    if item.count(":") > 1 and "[" not in item:  # a bare IPv6 address: no slots after it
        return _hosts([item], where, text, slots)
    name, colon, count = item.rpartition(":") if ":" in item else (item, "", "")
    workers = _count(count, bool(colon), slots, where, text)
    return _hosts(expand_hostlist(name), where, text, workers)


def _count(count: str, colon: bool, slots: int | None, where: str, text: str) -> int | None:
    """The workers of an entry: after its ':' or in its ``slots=``, not both."""
    if colon and not count.isdigit():
        raise ConfigError(f"{where}: {text!r}: {count!r} after ':' is not a number of workers")
    if colon and slots is not None:
        raise ConfigError(f"{where}: {text!r} gives the workers twice (':' and slots=)")
    number = int(count) if colon else slots
    if number is not None and number < 1:
        raise ConfigError(f"{where}: {text!r}: a host needs at least 1 worker")
    return number


def _hosts(names: list[str], where: str, text: str, slots: int | None) -> list[Host]:
    return [Host(check_host_name(name, where), slots) for name in names]


def _slots_word(words: list[str], where: str) -> int | None:
    slots = None
    for word in words:
        found = _SLOTS.match(word)
        if found:
            slots = int(found.group(1))
        elif not _MAX_SLOTS.match(word):
            raise ConfigError(
                f"{where}: {word!r} is not understood; a line is 'HOST', 'HOST:N' or 'HOST slots=N'"
            )
    return slots


def _checked(hosts: list[Host], source: str) -> list[Host]:
    if not hosts:
        raise ConfigError(f"{source} names no hosts")
    seen: set[str] = set()
    for host in hosts:
        if host.address in seen:
            raise ConfigError(
                f"{source} names {host.address} twice: give each host once, with its workers "
                "as HOST:N"
            )
        seen.add(host.address)
    return hosts
