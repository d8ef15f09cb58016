"""The machines of a job without a scheduler: ``--hosts a:4,b:4`` or a hostfile.

A hostfile is one host per line in any of the forms other launchers read: DeepSpeed's and
Open MPI's ``host slots=N``, MPICH's ``host:N``, a bare ``host``; ``#`` starts a comment.
Each host name may be a SLURM node list (``gpu[01-04]``), whose hosts get its slots. A host
without slots runs ``--nproc`` workers. ``user@host`` is passed to ssh as it is.

Example:
    >>> [str(h) for h in parse_hosts("gpu[01-02]:4,login")]
    ['gpu01:4', 'gpu02:4', 'login']
    >>> [str(h) for h in read_hostfile("a slots=2  # first\\nb:2\\nc\\n")]
    ['a:2', 'b:2', 'c']
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ddpkit.env.hostlist import expand_hostlist, split_hostlist
from ddpkit.errors import ConfigError

_SLOTS = re.compile(r"^slots=(\d+)$")
_MAX_SLOTS = re.compile(r"^max[-_]slots=\d+$")  # Open MPI's upper bound: nothing to start


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


def _entry(item: str, where: str, text: str, slots: int | None = None) -> list[Host]:
    """``HOST[:SLOTS]`` (HOST a node list), or HOST with ``slots`` given apart."""
    name, colon, count = item.rpartition(":") if ":" in item else (item, "", "")
    if colon and not count.isdigit():
        raise ConfigError(f"{where}: {text!r}: {count!r} after ':' is not a number of workers")
    if colon and slots is not None:
        raise ConfigError(f"{where}: {text!r} gives the workers twice (':' and slots=)")
    number = int(count) if colon else slots
    if number is not None and number < 1:
        raise ConfigError(f"{where}: {text!r}: a host needs at least 1 worker")
    return [Host(host, number) for host in expand_hostlist(name)]


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
