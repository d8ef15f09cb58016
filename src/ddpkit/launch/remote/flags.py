"""``ddpkit run --hosts a:4,b:4 train.py`` and ``--hostfile FILE``: the flags, and the job
they describe (:mod:`ddpkit.launch.remote.job`), checked on every host and started over ssh
(:mod:`ddpkit.launch.remote.ssh`).

The ``ddpkit run`` command line is passed on to every host as it is, less what this launch
fills in per host: the host options, ``--nnodes``, ``--node-rank``, ``--nproc`` and where the
nodes meet (the first host, at ``--master-port`` or 29500).

Example:
    >>> forwarded_argv(["--hosts", "a,b", "--max-restarts=2", "t.py", "--lr", "1"],
    ...                ["t.py", "--lr", "1"])
    ['--max-restarts=2', 't.py', '--lr', '1']
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ddpkit._core.protocol import DEFAULT_MASTER_PORT
from ddpkit.errors import ConfigError
from ddpkit.launch.quickparse import spellings_of
from ddpkit.launch.remote.hostfile import Host, load_hostfile, parse_hosts
from ddpkit.launch.remote.job import RemotePlan, Script, forwarded_environment
from ddpkit.launch.remote.ssh import Ssh, run_on_hosts

# Filled in per host, so not passed on as given (each takes a value).
_PER_HOST = {"--hosts", "--hostfile", "--env", "--remote-python", "--ssh-config", "--node-rank",
             "--node_rank", *spellings_of("nnodes", "master_port", "nproc_per_node")}  # fmt: skip
# Where the nodes meet is the first host: a rendezvous given as well contradicts it.
_MEETING = ("master", "master_addr", "rdzv_endpoint", "rdzv_backend", "rdzv_id", "standalone")


def add_host_arguments(run: argparse.ArgumentParser) -> None:
    """``run``'s flags for several machines over ssh.

    Example:
        >>> parser = argparse.ArgumentParser(); add_host_arguments(parser)
        >>> parser.parse_args(["--hosts", "a:2,b:2", "--env", "SEED=1"]).env
        ['SEED=1']
    """
    group = run.add_argument_group("several machines, no scheduler (over ssh)")
    group.add_argument("--hosts", metavar="HOST[:N],...",
                       help="start the job on these hosts over ssh, N workers each (default "
                       "--nproc); a SLURM node list works: gpu[01-04]:8")  # fmt: skip
    group.add_argument("--hostfile", metavar="FILE",
                       help="the hosts, a line each: 'host slots=N', 'host:N', 'host'")  # fmt: skip
    group.add_argument("--env", action="append", default=[], metavar="NAME[=VALUE]",
                       help="also set NAME on every host (a bare NAME: its value here, "
                       "kept out of any command line: use it for secrets); more in "
                       "./.ddpkit_env")  # fmt: skip
    group.add_argument("--remote-python", metavar="PATH", default=None,
                       help="the Python on the other hosts (default: this one's path)")  # fmt: skip
    group.add_argument("--ssh-config", metavar="FILE", default=None,
                       help="an ssh config file for the hosts (ssh -F)")  # fmt: skip


def hosts_given(args: argparse.Namespace) -> bool:
    """Whether the command line asks for several machines over ssh.

    Example:
        >>> hosts_given(argparse.Namespace(hosts=None, hostfile=None))
        False
    """
    return bool(args.hosts or args.hostfile)


def run_hosts(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Check every host, then run the job on all of them; its exit code.

    Example::

        run_hosts(args, ["--hosts", "a,b", "train.py"])
    """
    plan = remote_plan(args, argv)
    env = forwarded_environment(args.env)
    return run_on_hosts(plan, Script.of(args), env, Ssh(args.ssh_config))


def remote_plan(args: argparse.Namespace, argv: Sequence[str]) -> RemotePlan:
    """The job the flags describe, checked.

    Example::

        remote_plan(parser.parse_args(["--hosts", "a,b", "t.py"]), ["--hosts", "a,b", "t.py"])
    """
    if args.hosts and args.hostfile:
        raise ConfigError("give --hosts or --hostfile, not both")
    given = [f"--{name.replace('_', '-')}" for name in _MEETING if getattr(args, name, None)]
    if given:
        raise ConfigError(f"--hosts: the nodes meet at the first host; drop {', '.join(given)} "
                          "(--master-port picks its port)")  # fmt: skip
    hosts = parse_hosts(args.hosts) if args.hosts else load_hostfile(args.hostfile)
    nnodes = None if args.nnodes in (None, "1", "1:1") else args.nnodes  # 1:1 is torchrun's default
    _check_nnodes(nnodes, hosts)
    script = [args.training_script, *args.training_script_args]
    return RemotePlan(hosts, str(args.nproc_per_node), int(args.master_port or DEFAULT_MASTER_PORT),
                      forwarded_argv(argv, script), nnodes,
                      args.remote_python or sys.executable)  # fmt: skip


def forwarded_argv(argv: Sequence[str], script: Sequence[str]) -> list[str]:
    """``argv`` less the options filled in per host (those before the script only)."""
    end = len(argv) - len(script)
    if list(argv[end:]) != list(script):
        end -= 1  # torch's parser dropped a `--` from the script's arguments: it stays here
    options = list(argv[:end])
    kept: list[str] = []
    skip = False
    for word in options:
        if skip:
            skip = False
        elif word.split("=", 1)[0] in _PER_HOST:
            skip = "=" not in word
        else:
            kept.append(word)
    return [*kept, *argv[end:]]


def _check_nnodes(nnodes: str | None, hosts: list[Host]) -> None:
    if nnodes is None:
        return
    low, _, high = nnodes.partition(":")
    most = int(high or low) if (high or low).isdigit() else -1
    if most != len(hosts) and not (high and most >= len(hosts) >= int(low or 0)):
        raise ConfigError(f"--nnodes {nnodes} with {len(hosts)} host(s): give --nnodes "
                          f"{len(hosts)}, or MIN:MAX with MAX at least {len(hosts)}")  # fmt: skip
