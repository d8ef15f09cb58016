"""``ddpkit plan``: a dry run at a world size you do not have.

The unchanged script runs its first steps in one process as rank 0 of ``--world`` ranks over
torch's fake process group (see :mod:`ddpkit.tools.plan.recorder`); the report gives what
that rank holds (parameters, gradients, optimizer state, communication buffers), the
collectives of one step with their sizes, and the time they cannot go under on a link of
``--bandwidth`` (the ring bound, :mod:`ddpkit.tools.plan.costs`). Checkpoints and logs go to
a private scratch folder, never the script's own.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(); add_arguments(parser)
    >>> parser.parse_args(["--world", "1024", "train.py", "--lr", "1"]).script_args
    ['--lr', '1']
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from ddpkit._core.protocol import (
    CHECKPOINT_DIR_ENV,
    HANG_TIMEOUT_ENV,
    LOG_DIR_ENV,
    MAX_STEPS_ENV,
    PLAN_OUT_ENV,
    WORKER_SETUP_ENV,
)
from ddpkit.errors import ConfigError, DdpkitError
from ddpkit.launch.jobs import run_command
from ddpkit.tools.plan.costs import Kind, Link, Plan, ring_seconds, step_seconds
from ddpkit.tools.plan.recorder import PLAN_FILE

HELP = "a dry run at a world size you do not have: memory and collectives of one rank"
DESCRIPTION = (
    "Run SCRIPT's first --steps optimizer steps in one process as rank 0 of --world ranks, "
    "over torch's fake process group (its collectives move nothing), and report what the rank "
    "holds, the collectives of one step with their sizes, and their ring-bound time on a link "
    "of --bandwidth. Activations are not counted (on a GPU, the dry run's peak is shown)."
)
RECORDER_SETUP = "ddpkit.tools.plan.recorder:install"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """plan's options, the script and its arguments.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> parser.parse_args(["--world", "64", "t.py"]).nproc_per_node is None
        True
    """
    parser.add_argument(
        "--world",
        type=int,
        required=True,
        metavar="N",
        help="the world size to plan for (the ranks in all)",
    )
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        metavar="K",
        help="ranks per node (default: 8, or N where N < 8); HSDP shards within a node",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=2,
        metavar="S",
        help="optimizer steps to run (default 2; the last one is reported)",
    )
    parser.add_argument(
        "--bandwidth",
        type=float,
        default=25.0,
        metavar="GB/S",
        help="each rank's link, GB/s each way (default 25: a 200 Gb/s NIC)",
    )
    parser.add_argument(
        "--latency",
        type=float,
        default=5e-6,
        metavar="S",
        help="each hop's latency in seconds (default 5e-6: 5 us)",
    )
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the plan here")
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="stop the dry run after S seconds (default 600)",
    )
    parser.add_argument("script", help="the training script (trains with ddpkit)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="passed to the script")


def main(args: argparse.Namespace) -> int:
    """Entry of ``ddpkit plan``: runs the dry run and prints its report; 0 when it ran.

    Example::

        main(parser.parse_args(["--world", "1024", "examples/gpt.py", "--strategy", "fsdp"]))
    """
    per_node = _check(args)
    with tempfile.TemporaryDirectory(prefix="ddpkit-plan-") as scratch:
        plan = dry_run(args.script, args.script_args, args.world, per_node, args.steps,
                       Path(scratch), args.timeout)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(plan.to_json(), indent=1))
    print(report(plan, Link(args.bandwidth * 1e9, args.latency), args.script))
    return 0


def _check(args: argparse.Namespace) -> int:
    """The ranks per node; a clear error for numbers that cannot make a world."""
    if args.world < 1:
        raise ConfigError(f"--world {args.world}: the world needs at least 1 rank")
    per_node = args.nproc_per_node or min(8, args.world)
    if per_node < 1 or args.world % per_node:
        raise ConfigError(f"--world {args.world} is not a whole number of nodes of "
                          f"--nproc-per-node {per_node}: give a multiple")  # fmt: skip
    if args.steps < 1:
        raise ConfigError(f"--steps {args.steps}: the dry run needs at least 1 step")
    if args.bandwidth <= 0 or args.latency < 0:
        raise ConfigError("--bandwidth must be above 0 GB/s and --latency 0 s or more")
    return int(per_node)


def dry_run(script: str, script_args: list[str], world: int, per_node: int, steps: int,
            scratch: Path, timeout: float) -> Plan:  # fmt: skip
    """Run the script as rank 0 of ``world`` ranks for ``steps`` steps; its plan.

    Example::

        dry_run("examples/wine.py", [], 64, 8, 2, Path("/tmp/p"), 600).memory.total
    """
    env = {
        "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0",
        "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(per_node),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",  # never dialled: the group is fake
        WORKER_SETUP_ENV: RECORDER_SETUP,
        PLAN_OUT_ENV: str(scratch),
        MAX_STEPS_ENV: str(steps),
        HANG_TIMEOUT_ENV: "0",  # no peer to report a hang to
        CHECKPOINT_DIR_ENV: str(scratch / "checkpoints"),  # never the script's own
        LOG_DIR_ENV: str(scratch / "logs"),
    }  # fmt: skip
    command = [sys.executable, "-m", "ddpkit.launch.worker", script, *script_args]
    outcome = run_command(command, env, timeout)
    failure = outcome.failure(f"the dry run as rank 0 of {world}")
    if failure is not None:
        raise DdpkitError(failure)
    if not (scratch / PLAN_FILE).is_file():
        raise DdpkitError(
            "the dry run finished without a step: ddpkit plan follows training through "
            "ddpkit.Trainer or ddpkit.TrainLoop, with ddpkit.prepare_model"
        )
    return Plan.from_json(json.loads((scratch / PLAN_FILE).read_text()))


def report(plan: Plan, link: Link, script: str) -> str:
    """The plan as text: memory, one step's collectives, their time on ``link``.

    Example:
        >>> print(report(Plan(64, 8, "ddp", 2), Link(25e9, 5e-6), "t.py").splitlines()[0])
        ddpkit plan: t.py as rank 0 of 64 ranks (8 per node x 8 nodes), DDP, 2 step(s) ...
    """
    nodes = plan.world_size // max(1, plan.per_node)
    memory = plan.memory
    lines = [
        f"ddpkit plan: {script} as rank 0 of {plan.world_size:,} ranks ({plan.per_node} per "
        f"node x {nodes:,} node{'s' if nodes > 1 else ''}), {plan.strategy.upper()}, "
        f"{plan.steps} step(s) over torch's fake process group",
        f"  model: {plan.parameters:,} parameters",
        "  rank 0 holds:",
        f"    parameters        {_size(memory.parameters)}",
        f"    gradients         {_size(memory.gradients)}",
        f"    optimizer state   {_size(memory.optimizer)}",
        f"    comm. buffers     {_size(memory.buffers)}  ({_buffers_note(plan)})",
        f"    total             {_size(memory.total)}  (activations not counted)",
    ]
    if memory.device_peak is not None:
        lines.append(f"    GPU peak          {_size(memory.device_peak)}  (the dry run's, "
                     "activations included)")  # fmt: skip
    lines += _step_lines(plan, link)
    return "\n".join(lines)


def _step_lines(plan: Plan, link: Link) -> list[str]:
    calls = plan.per_step()
    lines = [f"  collectives of step {plan.steps} (rank 0):"]
    for kind in Kind:
        mine = [c for c in calls if c.kind is kind]
        if mine:
            groups = ", ".join(map(str, sorted({c.group_size for c in mine})))
            seconds = sum(ring_seconds(c, link) for c in mine)
            moved = _size(sum(c.bytes for c in mine))
            lines.append(f"    {kind.label:<15}{len(mine):>5} x  {moved} in all, over groups "
                         f"of {groups}: {seconds * 1e3:.2f} ms")  # fmt: skip
    if len(lines) == 1:
        lines.append("    none (nothing crosses ranks in a step)")
    moving, waiting = step_seconds(plan, link)
    lines.append(
        f"  communication per step, ring-bound at {link.bandwidth / 1e9:g} GB/s and "
        f"{link.latency * 1e6:g} us a hop: {(moving + waiting) * 1e3:.2f} ms "
        f"({moving * 1e3:.2f} ms moving bytes, {waiting * 1e3:.2f} ms in latency; overlap with "
        "compute not counted)"
    )
    setup = [c for c in plan.collectives if c.step == 0]
    if setup:
        lines.append(f"  set-up (once): {len(setup)} collective(s), "
                     f"{_size(sum(c.bytes for c in setup))}")  # fmt: skip
    return lines


def _buffers_note(plan: Plan) -> str:
    if plan.strategy == "ddp":
        return "DDP's gradient buckets, where they are not the gradients themselves"
    if plan.strategy in ("fsdp", "hsdp"):
        return "the largest unit gathered whole"
    return "none"


def _size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:8.2f} {unit}"
    return f"{count:8d}   B"  # aligned with the others' units
