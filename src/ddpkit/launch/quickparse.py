"""``ddpkit run``'s command line read without importing torch, where it can be: torchrun's
parser (``torch.distributed.run``) costs an import of torch, 0.85 s of the start-up here.
The machine that starts a job over ssh (``--hosts``) runs no worker and needs no torch at
all; warm workers (``--run-path --start-method forkserver``) start their server before the
launcher imports torch, so the two imports run side by side.

The command line is split the way torchrun's parser splits it, from the flags the installed
torch declares (read from its ``torch/distributed/run.py`` as text, not imported) and
ddpkit's own; only the flags a launch over ssh and a warm server read are parsed here. Every host's
``ddpkit run`` gets the command line as given and checks it whole, with torch's parser,
before it starts anything. Anything this module does not recognise (an abbreviation, an
unknown flag, a ``PET_*`` default in the environment, ``--help``) leaves the command line to
the full parser, here, as without ``--hosts``.

Example:
    >>> import argparse
    >>> own = argparse.ArgumentParser(add_help=False); _ = own.add_argument("--hosts")
    >>> args = parse_for_hosts(["--hosts", "a,b", "--max-restarts", "3", "t.py", "--lr", "1"],
    ...                        own, environ={})
    >>> args.hosts, args.training_script, args.training_script_args
    ('a,b', 't.py', ['--lr', '1'])
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from ddpkit._compat.torchrun import torchrun_flags

# What a --hosts launch (hosts.py) and a warm server read of torchrun's flags, with the
# values ddpkit's full parser gives them when not given (torch's defaults; None where ddpkit
# unsets them).
_READ = {
    ("--nnodes",): ("nnodes", "1:1"),
    ("--nproc-per-node", "--nproc_per_node", "--nproc"): ("nproc_per_node", "1"),
    ("--master",): ("master", None),
    ("--master-port", "--master_port"): ("master_port", None),
    ("--master-addr", "--master_addr"): ("master_addr", None),
    ("--rdzv-endpoint", "--rdzv_endpoint"): ("rdzv_endpoint", ""),
    ("--rdzv-backend", "--rdzv_backend"): ("rdzv_backend", None),
    ("--rdzv-id", "--rdzv_id"): ("rdzv_id", None),
    ("--start-method", "--start_method"): ("start_method", None),  # None: warm.choice says
}
_READ_SWITCHES = {
    "--standalone": "standalone",
    "-m": "module",
    "--module": "module",
    "--no-python": "no_python",
    "--no_python": "no_python",
    "--run-path": "run_path",
    "--run_path": "run_path",
}
_HELP = frozenset({"-h", "--help"})


def spellings_of(*dests: str) -> frozenset[str]:
    """Every spelling torchrun (and ddpkit) accepts for the flags that set ``dests``: one
    table, read by the quick parse and by ``--hosts``, which fills these in per host.

    Example:
        >>> sorted(spellings_of("master_port"))
        ['--master-port', '--master_port']
    """
    return frozenset(flag for flags, (dest, _) in _READ.items() if dest in dests for flag in flags)


def parse_for_hosts(
    argv: Sequence[str], own: argparse.ArgumentParser, environ: Mapping[str, str] | None = None
) -> argparse.Namespace | None:
    """``argv`` parsed for a launch over ssh, torch not imported; None when it is not one
    (no ``--hosts`` or ``--hostfile``) or when only the full parser can read it.

    ``own`` holds ddpkit's own ``run`` flags (the host flags among them).

    Example::

        args = parse_for_hosts(sys.argv[2:], own_parser)   # None: parse it fully
    """
    args = parse_without_torch(argv, own, environ)
    if args is None or not (getattr(args, "hosts", None) or getattr(args, "hostfile", None)):
        return None
    return args


def parse_without_torch(
    argv: Sequence[str], own: argparse.ArgumentParser, environ: Mapping[str, str] | None = None
) -> argparse.Namespace | None:
    """``argv`` read without torch: ddpkit's own flags (``own``) and the torchrun flags a
    launch over ssh or a warm server reads; None when only the full parser can read it.
    Nothing is checked beyond what those need: each launch's full parser checks it all.

    Example:
        >>> own = argparse.ArgumentParser(add_help=False)
        >>> args = parse_without_torch(["--run-path", "--start-method=forkserver", "t.py"],
        ...                            own, environ={})
        >>> args.run_path, args.start_method, args.nproc_per_node
        (True, 'forkserver', '1')
    """
    env = os.environ if environ is None else environ
    flags = _flags(own)
    split = _split(argv, flags) if flags and not any(k.startswith("PET_") for k in env) else None
    if split is None:
        return None
    pairs, script = split
    owned = _owned(own)
    # FLAG=VALUE, one word: a value that starts with "-" (--hosts=-oProxyCommand=...) stays
    # the flag's value, which its own check then refuses, instead of a flag of its own.
    args = own.parse_args(["=".join(pair) for pair in pairs if pair[0] in owned])
    _read_torchrun_flags(args, pairs)
    if not str(args.master_port or 0).isdigit():
        return None  # torch's parser says what is wrong with it
    args.master_port = None if args.master_port is None else int(args.master_port)
    # The script's arguments as given: a `--` among them stays (each host's parser drops it)
    args.training_script, args.training_script_args = script[0], list(script[1:])
    return args


def _split(
    argv: Sequence[str], flags: Mapping[str, bool]
) -> tuple[list[tuple[str, ...]], list[str]] | None:
    """The options as (flag,) or (flag, value) pairs, and the script with its arguments:
    None for a word torchrun's parser might read otherwise."""
    pairs: list[tuple[str, ...]] = []
    words = list(argv)
    while words and words[0].startswith("-") and words[0] != "-":
        flag, attached = _flag_of(words.pop(0), flags)
        if flag is None or flag in _HELP:
            return None
        if attached is not None or not flags[flag]:
            pairs.append((flag,) if attached is None else (flag, attached))
        elif words:
            pairs.append((flag, words.pop(0)))
        else:
            return None
    return (pairs, words) if words else None


def _flag_of(word: str, flags: Mapping[str, bool]) -> tuple[str | None, str | None]:
    """The known flag a word gives, and a value attached to it (``--tee=3``, ``-t3``)."""
    if word in flags:
        return word, None
    name, equals, value = word.partition("=")
    if equals and name.startswith("--") and flags.get(name):
        return name, value
    if not word.startswith("--") and flags.get(word[:2]):
        return word[:2], word[2:]
    return None, None


def _read_torchrun_flags(args: argparse.Namespace, pairs: Sequence[tuple[str, ...]]) -> None:
    """Set what hosts.py reads, as torchrun's parser would: the last of a flag's spellings."""
    for dest, default in _READ.values():
        setattr(args, dest, default)
    for dest in _READ_SWITCHES.values():
        setattr(args, dest, False)
    spelled = {s: dest for spellings, (dest, _) in _READ.items() for s in spellings}
    for pair in pairs:
        if pair[0] in spelled:
            setattr(args, spelled[pair[0]], pair[1])
        elif pair[0] in _READ_SWITCHES:
            setattr(args, _READ_SWITCHES[pair[0]], True)


def _owned(own: argparse.ArgumentParser) -> frozenset[str]:
    return frozenset(s for action in own._actions for s in action.option_strings)


def _flags(own: argparse.ArgumentParser) -> dict[str, bool]:
    """Every flag ``ddpkit run`` knows, each with whether it takes a value; empty when
    torch's flags cannot be read."""
    torchrun = torchrun_flags()
    if not torchrun:
        return {}
    ours = {s: a.nargs != 0 for a in own._actions for s in a.option_strings}
    return {**torchrun, **ours}
