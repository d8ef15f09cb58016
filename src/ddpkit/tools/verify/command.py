"""``ddpkit verify``: prove N workers compute what 1 process computes (or show why not).

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(); add_arguments(parser)
    >>> config_from_args(parser.parse_args(["t.py", "--lr", "1", "--steps", "3"])).steps
    3
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ddpkit.errors import ConfigError
from ddpkit.tools.verify.runner import DEFAULT_STEPS, DEFAULT_TIMEOUT_S, VerifyConfig, verify

HELP = "prove N workers compute what 1 process computes (or show why not)"
DESCRIPTION = (
    "Run SCRIPT for K optimizer steps as N workers and as one process with the same global "
    "batch, seed and samples; compare every tensor, the sampler's coverage and the replicas. "
    "Exit code 0 on PASS, 1 on FAIL. verify's own options may come before or after SCRIPT; "
    "everything else (and all after --) is the script's."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """verify's options, the script and its arguments.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> parser.parse_args(["--workers", "4", "t.py"]).workers
        4
    """
    _add_verify_options(parser, None)
    parser.add_argument("script", help="the training script (trains with ddpkit.Trainer)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="passed to the script")


def main(args: argparse.Namespace) -> int:
    """Entry of ``ddpkit verify``: prints the report; 0 on PASS, 1 on FAIL.

    Example::

        main(parser.parse_args(["examples/wine.py", "--workers", "2"]))
    """
    passed, text = verify(config_from_args(args))
    print(text)
    return 0 if passed else 1


def _add_verify_options(parser: argparse.ArgumentParser, default: Any) -> None:
    def pick(value: Any) -> Any:
        return value if default is None else default

    parser.add_argument("--workers", type=int, default=pick(2), metavar="N",
                        help="workers to compare with one process (default: 2; 1: the DDP/FSDP "
                             "wrapper alone against the plain model, as on one GPU)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=pick(DEFAULT_STEPS), metavar="K",
                        help=f"optimizer steps to compare (default: {DEFAULT_STEPS})")  # fmt: skip
    parser.add_argument("--then", type=int, default=pick(None), metavar="M",
                        help="resume the workers' run on M workers halfway, from its "
                             "checkpoint (an elastic job's world changing)")  # fmt: skip
    parser.add_argument("--replica-groups", type=int, default=pick(None), metavar="G",
                        help="experimental: a fault-tolerant run (ReplicaGroups, "
                             "torchft) of G replica groups of N workers each against one "
                             "process")  # fmt: skip
    parser.add_argument("--kill-at", type=int, default=pick(None), metavar="K",
                        help="with --replica-groups: the last rank of the last group kills "
                             "itself with SIGKILL after step K; torch's agent starts its group "
                             "again and it heals from a live one, and the result must still "
                             "be one process's")  # fmt: skip
    parser.add_argument("--rtol", type=float, default=pick(None),
                        help="relative tolerance (default: 1e-4 fp32, 2e-2 bf16/fp16)")  # fmt: skip
    parser.add_argument("--atol", type=float, default=pick(None),
                        help="absolute tolerance (default: 1e-6 fp32, 1e-3 bf16/fp16)")  # fmt: skip
    parser.add_argument("--check-every", type=int, default=pick(1), metavar="M",
                        help="compare the replicas every M steps (default: 1)")  # fmt: skip
    parser.add_argument("--out", default=pick(None),
                        help="keep both runs' records and logs in this folder")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=pick(DEFAULT_TIMEOUT_S), metavar="S",
                        help="seconds each run may take (default: 600)")  # fmt: skip


def config_from_args(args: argparse.Namespace) -> VerifyConfig:
    """The parsed flags as a :class:`VerifyConfig` (verify's options may follow SCRIPT).

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> args = parser.parse_args(["t.py", "--lr", "1", "--steps", "3"])
        >>> config_from_args(args).steps, config_from_args(args).script_args
        (3, ('--lr', '1'))
    """
    late = argparse.ArgumentParser(add_help=False)
    _add_verify_options(late, argparse.SUPPRESS)
    script_args = list(args.script_args)
    cut = script_args.index("--") if "--" in script_args else len(script_args)
    found, unknown = late.parse_known_args(script_args[:cut])
    merged = {**vars(args), **vars(found)}
    _check_counts(merged)
    return VerifyConfig(
        script=args.script,
        script_args=tuple(unknown + script_args[cut + 1 :]),
        workers=merged["workers"],
        steps=merged["steps"],
        then=merged["then"],
        replica_groups=merged["replica_groups"],
        kill_at=merged["kill_at"],
        rtol=merged["rtol"],
        atol=merged["atol"],
        check_every=merged["check_every"],
        out=Path(merged["out"]) if merged["out"] else None,
        timeout_s=merged["timeout"],
    )


def _check_counts(values: dict[str, Any]) -> None:
    # One worker is launched and wrapped (DDP/FSDP over a group of one): against the plain
    # process it checks what the wrapper changes, the one comparison a single GPU allows.
    if values["workers"] < 1:
        raise ConfigError(f"--workers must be at least 1 (got {values['workers']})")
    if values["then"] is not None and values["then"] < 1:
        raise ConfigError(f"--then must be at least 1 worker (got {values['then']})")
    groups = values["replica_groups"]
    if groups is not None and groups < 1:
        raise ConfigError(f"--replica-groups must be at least 1 (got {groups})")
    if groups is not None and values["then"] is not None:
        raise ConfigError(
            "--replica-groups and --then cannot be combined: a fault-tolerant job changes "
            "size without a restart; verify one of them at a time"
        )
    kill_at = values["kill_at"]
    if kill_at is not None and (groups is None or groups < 2):
        raise ConfigError("--kill-at kills a process of a replica group while the others train "
                          "on: give --replica-groups 2 or more")  # fmt: skip
    if kill_at is not None and not 1 <= kill_at < values["steps"]:
        raise ConfigError(f"--kill-at must be a step before the last: 1 to {values['steps'] - 1} "
                          f"with --steps {values['steps']} (got {kill_at})")  # fmt: skip
    for flag in ("steps", "check_every"):
        if values[flag] < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be at least 1 (got {values[flag]})")
