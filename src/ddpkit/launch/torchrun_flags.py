"""torchrun's command line, whole, for ``ddpkit run``: torch's own parser, then ddpkit's flags.

The flags are torch's (``torch.distributed.run.get_args_parser()``), so every torchrun
spelling works with torchrun's meaning: ``--nproc_per_node=4`` and ``--nproc-per-node 4``,
``--standalone``, ``--rdzv-backend/--rdzv-endpoint/--rdzv-id/--rdzv-conf``,
``--master-addr/--master-port``, ``-m``, ``--no-python``, ``--run-path``, ``--log-dir``,
``-r/--redirects``, ``-t/--tee``, ``--local-ranks-filter``, ``--monitor-interval``,
``--start-method``, ``--role``, ``--nproc-per-node gpu|cpu|auto``, and the ``PET_*``
environment variables as defaults. ddpkit adds ``--nproc`` and ``--master ADDR:PORT``
(shorter spellings), ``--hang-timeout`` and ``--debug-collectives``.

Where ddpkit is better it stays so: a one-node job (``--standalone``, or no rendezvous
flags, or a rendezvous on this host) meets on loopback through ddpkit's store. torchrun flags
ddpkit cannot honour stop with an error that says so; none is ignored silently.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(); add_torchrun_arguments(parser)
    >>> args = parser.parse_args(["--standalone", "--nproc_per_node=2", "-m", "pkg.train"])
    >>> args.nproc_per_node, args.module, args.training_script
    ('2', True, 'pkg.train')
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ddpkit._core.log import command_logger
from ddpkit._core.protocol import DEFAULT_MASTER_PORT
from ddpkit._core.torchversion import torch_at_least, torch_text
from ddpkit.errors import ConfigError

# torchrun's defaults for these say nothing the user chose: None tells "not given".
# start_method: None until ddpkit.launch.warm.choice picks warm workers or torchrun's own
_UNSET_UNLESS_GIVEN = (
    "rdzv_backend",
    "rdzv_id",
    "master_addr",
    "master_port",
    "node_rank",
    "start_method",
)
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")
_BACKENDS = ("static", "c10d")
# Flags of torch's launcher that ddpkit's launch does not carry; refused when not default.
_UNSUPPORTED: dict[str, object] = {
    "event_log_handler": "null",
    "logs_specs": None,
    "numa_binding": None,
    "duplicate_stdout_filters": [],
    "duplicate_stderr_filters": [],
    "virtual_local_rank": False,
    # ddpkit forwards its own set (SIGUSR1 included) and stops workers its own way
    "signals_to_handle": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
    "shutdown_timeout": None,
}
# The torch release whose torchrun first has each of them: on an older torch ddpkit still
# knows the flag, and its error says which torch has it.
_ADDED_IN = {
    "event_log_handler": "2.8",
    "numa_binding": "2.9",
    "duplicate_stdout_filters": "2.10",
    "duplicate_stderr_filters": "2.10",
    "virtual_local_rank": "2.10",
    "signals_to_handle": "2.10",
    "shutdown_timeout": "2.12",
}


def add_torchrun_arguments(run: argparse.ArgumentParser) -> None:
    """Every flag of the installed torch's torchrun, with its meaning and PET_* defaults.

    Example:
        >>> parser = argparse.ArgumentParser(); add_torchrun_arguments(parser)
        >>> parser.parse_args(["--nnodes=1", "t.py", "--lr", "1"]).training_script_args
        ['--lr', '1']
    """
    from torch.distributed.run import get_args_parser  # the launcher imports torch anyway

    source = get_args_parser()
    # As argparse's parents= does, without torch's -h (the command has its own).
    source._actions = [a for a in source._actions if not isinstance(a, argparse._HelpAction)]
    for group in source._action_groups:
        group._group_actions = [a for a in group._group_actions if a in source._actions]
    run._add_container_actions(source)
    _add_newer_flags(run, {a.dest for a in source._actions})
    unset = {dest: None for dest in _UNSET_UNLESS_GIVEN if f"PET_{dest.upper()}" not in os.environ}
    run.set_defaults(**unset)


def _add_newer_flags(run: argparse.ArgumentParser, known: set[str]) -> None:
    """torchrun flags of a newer torch than this one, so that they are refused by name."""
    for dest in _ADDED_IN:
        if dest in known:
            continue
        spellings = ("--" + dest.replace("_", "-"), "--" + dest)
        action = "store_true" if dest == "virtual_local_rank" else "store"
        run.add_argument(*spellings, dest=dest, action=action, help=argparse.SUPPRESS)


def resolve_nproc(value: str) -> int:
    """``--nproc-per-node``'s value as a count: N, or ``gpu``, ``cpu``, ``auto`` as torchrun
    counts them.

    Example:
        >>> resolve_nproc("3")
        3
        >>> resolve_nproc("many")
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: --nproc-per-node 'many' is not a number, gpu, cpu or auto
    """
    if str(value).lstrip("-").isdigit():
        return int(value)
    if value not in ("gpu", "cpu", "auto", "xpu"):
        raise ConfigError(f"--nproc-per-node {value!r} is not a number, gpu, cpu or auto")
    from torch.distributed.run import determine_local_world_size

    try:
        return int(determine_local_world_size(value))
    except ValueError as err:
        raise ConfigError(f"--nproc-per-node {value}: {err} (no such device here)") from None


def rendezvous_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The rendezvous the flags ask for, as ``LaunchPlan`` fields: ``master`` (static),
    ``rdzv_endpoint`` (dynamic) or neither (this node alone, on loopback).

    Example:
        >>> parser = argparse.ArgumentParser(); add_torchrun_arguments(parser)
        >>> rendezvous_flags(parser.parse_args(["--rdzv-backend=c10d",
        ...     "--rdzv-endpoint=localhost:29400", "t.py"]))
        {'master': None, 'rdzv_endpoint': None}
    """
    backend = args.rdzv_backend
    if backend is not None and backend not in _BACKENDS:
        raise ConfigError(
            f"--rdzv-backend {backend} is not supported by ddpkit run (static and c10d are); "
            "use c10d with --rdzv-endpoint HOST:PORT"
        )
    endpoint = args.rdzv_endpoint or None
    static_endpoint = endpoint if backend == "static" else None
    master = getattr(args, "master", None) or _master_from(args, static_endpoint)
    dynamic = endpoint if backend != "static" else None  # with --master too: refused later
    one_node = str(args.nnodes).split(":")[0] == str(args.nnodes).split(":")[-1] == "1"
    if args.standalone or (one_node and _on_this_host(master or dynamic)):
        if not args.standalone and (master or dynamic):
            _say_the_endpoint_is_not_used(str(master or dynamic))
        return {"master": None, "rdzv_endpoint": None}
    return {"master": master, "rdzv_endpoint": dynamic}


def _say_the_endpoint_is_not_used(endpoint: str) -> None:
    # torchrun would listen there; ddpkit's one-node store picks a free loopback port, so
    # two jobs on one node never collide. Said, since the workers' MASTER_PORT differs.
    command_logger("run").info(
        f"one node: {endpoint} is not used; the workers meet on ddpkit's loopback store, "
        "at a port picked when it binds (the endpoint is used with --nnodes 2 or more)"
    )


def log_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--log-dir``, ``--redirects``, ``--tee`` and ``--local-ranks-filter``, checked.

    Example:
        >>> parser = argparse.ArgumentParser(); add_torchrun_arguments(parser)
        >>> log_options(parser.parse_args(["--tee", "3", "--local-ranks-filter", "0", "t.py"]))
        {'log_dir': None, 'redirects': '0', 'tee': '3', 'local_ranks_filter': (0,)}
    """
    ranks = tuple(int(r) for r in str(args.local_ranks_filter or "").split(",") if r.strip())
    return {
        "log_dir": args.log_dir,
        "redirects": str(args.redirects),
        "tee": str(args.tee),
        "local_ranks_filter": ranks,
    }


def parse_rdzv_conf(text: str) -> dict[str, str]:
    """``--rdzv-conf k=v,k2=v2`` as a dict.

    Example:
        >>> parse_rdzv_conf("join_timeout=600, read_timeout=60")
        {'join_timeout': '600', 'read_timeout': '60'}
    """
    conf: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--rdzv-conf {text!r}: {pair!r} is not KEY=VALUE")
        conf[key.strip()] = value.strip()
    return conf


def check_supported(args: argparse.Namespace) -> None:
    """Refuse, by name, a torchrun flag ddpkit's launch cannot honour.

    Example:
        >>> parser = argparse.ArgumentParser(); add_torchrun_arguments(parser)
        >>> check_supported(parser.parse_args(["--logs-specs", "mine", "t.py"]))
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: ddpkit run does not support torchrun's --logs-specs ...
    """
    for dest, default in _UNSUPPORTED.items():
        if getattr(args, dest, default) not in (default, None):
            raise ConfigError(_refusal(dest, getattr(args, dest)))
    if args.no_python and args.module:
        raise ConfigError("--no-python and -m/--module cannot go together (as in torchrun)")


def _refusal(dest: str, value: object) -> str:
    flag = "--" + dest.replace("_", "-")
    added = _ADDED_IN.get(dest)
    if added and not torch_at_least(added):
        return (
            f"torchrun's {flag} needs torch {added} or newer (this is torch {torch_text()}), "
            "and ddpkit run does not support it either: leave it out"
        )
    return (
        f"ddpkit run does not support torchrun's {flag} (got {value!r}); "
        "run torchrun itself for it, or leave it out"
    )


def _master_from(args: argparse.Namespace, endpoint: str | None) -> str | None:
    if endpoint:
        return endpoint
    if args.master_addr is None and args.master_port is None:
        return None
    return f"{args.master_addr or '127.0.0.1'}:{args.master_port or DEFAULT_MASTER_PORT}"


def _on_this_host(endpoint: str | None) -> bool:
    if endpoint is None:
        return True
    host = endpoint.rpartition(":")[0] if ":" in endpoint else endpoint  # port 0 included
    return host.strip("[]") in _LOCAL_HOSTS
