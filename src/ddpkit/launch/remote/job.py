"""What each host of ``ddpkit run --hosts`` runs: ``ddpkit run`` in the same folder with the
same Python, its node rank and the rendezvous endpoint filled in, and the environment the
job needs.

The environment each host gets: the variables named by :data:`FORWARDED_PREFIXES` and
:data:`FORWARDED_NAMES` as they are here (ddpkit's settings, the collectives', torch's,
``PYTHONPATH``, the trackers'), then the ``.ddpkit_env`` file of the working folder (``NAME=VALUE``
lines, as DeepSpeed's ``.deepspeed_env``), then ``--env NAME[=VALUE]`` (a bare NAME: its value
here). A host's own login environment comes first; these win over it.

Example:
    >>> plan = RemotePlan(hosts=[Host("a"), Host("b")], nproc="2", port=29500, argv=["t.py"])
    >>> plan.arguments(1)
    ['--nnodes', '2', '--node-rank', '1', '--master', 'a:29500', '--nproc', '2', 't.py']
"""

from __future__ import annotations

import argparse
import enum
import os
import re
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddpkit.errors import ConfigError
from ddpkit.launch.remote.hostfile import Host
from ddpkit.launch.remote.order import HostOrder, Probe

FORWARDED_PREFIXES = ("DDPKIT_", "NCCL_", "GLOO_", "TORCH_", "PYTORCH_", "OMP_", "WANDB_",
                      "MLFLOW_", "AWS_", "HF_")  # fmt: skip
FORWARDED_NAMES = ("PYTHONPATH", "PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG")
ENV_FILE = ".ddpkit_env"
LINK_TIMEOUT_S = 5  # how long the other hosts try to reach the first one's port
# The remote Python's path is a word of the remote login shell's command (ssh sends one
# string): only characters that no shell (sh, bash, zsh, fish, csh) reads as syntax.
_SHELL_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./+][A-Za-z0-9_./+-]*$")


class ScriptKind(enum.Enum):
    """How ``ddpkit run`` names what the workers run: a file, ``-m`` a module, or
    ``--no-python`` a program."""

    FILE = "file"
    MODULE = "module"
    PROGRAM = "program"


@dataclass(frozen=True)
class Script:
    """What every host must find before the job starts there.

    Example:
        >>> Script("pkg.train", ScriptKind.MODULE).missing()
        'pkg.train is not a module its Python finds there (in the same folder)'
    """

    name: str
    kind: ScriptKind = ScriptKind.FILE

    @classmethod
    def of(cls, args: argparse.Namespace) -> Script:
        """The script ``ddpkit run``'s flags name."""
        kind = ScriptKind.MODULE if args.module else ScriptKind.FILE
        return cls(args.training_script, ScriptKind.PROGRAM if args.no_python else kind)

    def missing(self) -> str:
        """Why a host that lacks it is not ready."""
        return {
            ScriptKind.FILE: f"{self.name} does not exist there (in the same folder)",
            ScriptKind.MODULE: f"{self.name} is not a module its Python finds there "
            "(in the same folder)",
            ScriptKind.PROGRAM: f"{self.name} is not a program on the PATH there",
        }[self.kind]


@dataclass(frozen=True)
class RemotePlan:
    """One job over ``hosts``: what every host's ``ddpkit run`` is given.

    ``argv`` is the ``ddpkit run`` command line less the host options (flags and script);
    ``nnodes`` is ``--nnodes`` as given (``MIN:MAX`` makes the job elastic: nodes meet at
    the first host's c10d store instead of taking fixed ranks).

    Example:
        >>> RemotePlan([Host("a"), Host("b")], "2", 29500, ["t.py"], nnodes="1:2").arguments(0)[:4]
        ['--nnodes', '1:2', '--rdzv-backend', 'c10d']
    """

    hosts: list[Host]
    nproc: str  # --nproc as given (a number, or gpu/cpu/auto), resolved on each host
    port: int
    argv: list[str]
    nnodes: str | None = None
    python: str = sys.executable
    cwd: str = field(default_factory=os.getcwd)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        if not _SHELL_SAFE_PATH.match(self.python):
            raise ConfigError(
                f"--remote-python {self.python!r}: ssh hands the Python's path to each host's "
                "login shell, so it may hold only letters, digits and . _ + - /; give one "
                "without spaces (a symlink to it will do)"
            )

    @property
    def first(self) -> str:
        """Where the nodes meet: the first host's address."""
        return self.hosts[0].address

    @property
    def meeting_point(self) -> str:
        """The first host's ``ADDR:PORT`` (an IPv6 address in brackets).

        Example:
            >>> RemotePlan([Host("fd00::1")], "1", 29500, []).meeting_point
            '[fd00::1]:29500'
        """
        return f"{self.hosts[0].endpoint_host}:{self.port}"

    def min_nodes(self) -> int:
        """The fewest nodes the job runs on: MIN of ``--nnodes MIN:MAX``, else every host.

        Example:
            >>> RemotePlan([Host("a"), Host("b"), Host("c")], "1", 1, [], nnodes="2:3").min_nodes()
            2
        """
        if self.nnodes is not None and ":" in self.nnodes:
            return int(self.nnodes.split(":")[0])
        return len(self.hosts)

    def arguments(self, index: int) -> list[str]:
        """``ddpkit run``'s arguments on host ``index``."""
        workers = ["--nproc", self.hosts[index].workers(self.nproc)]
        if self.nnodes is not None and ":" in self.nnodes:
            meet = ["--rdzv-backend", "c10d", "--rdzv-endpoint", self.meeting_point,
                    "--rdzv-id", self.run_id]  # fmt: skip
            return ["--nnodes", self.nnodes, *meet, *workers, *self.argv]
        fixed = ["--node-rank", str(index), "--master", self.meeting_point]
        return ["--nnodes", str(len(self.hosts)), *fixed, *workers, *self.argv]

    def order(self, index: int, script: Script, env: Mapping[str, str]) -> HostOrder:
        """What host ``index`` is told on its session's standard input: the folder, the
        probe, ``ddpkit run``'s arguments and ``env``.

        Example:
            >>> plan = RemotePlan([Host("a"), Host("b")], "1", 29500, ["t.py"], cwd="/runs")
            >>> order = plan.order(1, Script("t.py"), {"SEED": "3"})
            >>> order.cwd, order.probe.first, order.env
            ('/runs', 'a', {'SEED': '3'})
        """
        peers, first = (len(self.hosts) - 1, None) if index == 0 else (0, self.first)
        probe = Probe(script.kind.value, script.name, self.port, peers, first, LINK_TIMEOUT_S)
        return HostOrder(self.cwd, probe, self.arguments(index), dict(env))


def forwarded_environment(
    asked: Sequence[str], environ: Mapping[str, str] | None = None, folder: str | None = None
) -> dict[str, str]:
    """The variables every host gets: the forwarded ones, ``.ddpkit_env``, then ``asked``
    (``--env NAME[=VALUE]``).

    Example:
        >>> forwarded_environment(["SEED=3", "HOME"], {"NCCL_DEBUG": "INFO", "HOME": "/me"})
        {'NCCL_DEBUG': 'INFO', 'SEED': '3', 'HOME': '/me'}
    """
    env = os.environ if environ is None else environ
    chosen = {k: v for k, v in env.items() if k.startswith(FORWARDED_PREFIXES)}
    chosen.update({k: env[k] for k in FORWARDED_NAMES if k in env})
    chosen.update(_env_file(Path(folder or os.getcwd()) / ENV_FILE))
    for item in asked:
        name, equals, value = item.partition("=")
        if not name.isidentifier():
            raise ConfigError(f"--env {item!r}: give NAME=VALUE, or NAME for its value here")
        if not equals and name not in env:
            raise ConfigError(f"--env {name}: {name} is not set here; give {name}=VALUE")
        chosen[name] = value if equals else env[name]
    return chosen


def _env_file(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    found: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        name, equals, value = text.partition("=")
        if not equals or not name.strip().isidentifier():
            raise ConfigError(f"{path} line {number}: {line!r} is not NAME=VALUE")
        found[name.strip()] = value.strip()
    return found
