"""Does the job fit the partition? ``ddpkit slurm`` asks ``sinfo`` before writing the script.

sbatch accepts a job that asks a node for more CPUs or GPUs than any node of the partition
has, or for more nodes than it holds, and leaves it PENDING with ``Reason=PartitionConfig``
for ever: a hang in the queue instead of an error. Where ``sinfo`` answers, ``ddpkit slurm``
refuses such a request with the numbers; where it does not (a laptop, another cluster), the
script is written unchecked.

Example:
    >>> shapes = parse_sinfo("debug*|1|2|(null)\\ngpu|4|64|gpu:a100:8(S:0-1)")
    >>> [(s.partition, s.nodes, s.cpus, s.gpus, s.default) for s in shapes]
    [('debug', 1, 2, 0, True), ('gpu', 4, 64, 8, False)]
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from ddpkit.errors import ConfigError
from ddpkit.tools.slurm.script import SbatchOptions

SINFO_FORMAT = "%P|%D|%c|%G"  # partition, node count, CPUs per node, generic resources


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of one partition alike in CPUs and GPUs, as one line of ``sinfo``.

    Example:
        >>> NodeGroup("debug", nodes=2, cpus=8, gpus=0, default=True).cpus
        8
    """

    partition: str
    nodes: int
    cpus: int
    gpus: int
    default: bool


def parse_sinfo(text: str) -> list[NodeGroup]:
    """The node groups of ``sinfo --noheader --format='%P|%D|%c|%G'``.

    Example:
        >>> parse_sinfo("batch|3|16|gpu:2,mps:100")[0].gpus
        2
    """
    groups = []
    for line in text.splitlines():
        partition, nodes, cpus, gres = line.strip().split("|")
        name, default = partition.rstrip("*"), partition.endswith("*")
        groups.append(NodeGroup(name, int(nodes), int(cpus.rstrip("+")), _gpus(gres), default))
    return groups


def _gpus(gres: str) -> int:
    # gpu:4, gpu:a100:4, gpu:a100:4(S:0-1); other resources (mps:100) are not GPUs
    total = 0
    for item in gres.split(","):
        fields = item.split("(")[0].split(":")
        if fields[0] == "gpu" and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def cluster_node_groups() -> list[NodeGroup] | None:
    """What ``sinfo`` says of this cluster's partitions; None where it cannot be asked.

    Example:
        >>> groups = cluster_node_groups()  # None outside a SLURM cluster
    """
    if shutil.which("sinfo") is None:
        return None
    try:
        done = subprocess.run(["sinfo", "--noheader", f"--format={SINFO_FORMAT}"],
                              capture_output=True, text=True, timeout=20)  # fmt: skip
        return parse_sinfo(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None  # an unreachable controller or an odd format: do not block the script


def check_fits(options: SbatchOptions, groups: list[NodeGroup]) -> None:
    """Refuse a request no node group of the partition can ever run.

    Example:
        >>> check_fits(SbatchOptions(cpus_per_task=2), [NodeGroup("debug", 1, 2, 0, True)])
    """
    partition = options.partition or next((g.partition for g in groups if g.default), None)
    mine = [g for g in groups if g.partition == partition]
    if not mine:
        return  # no such (or no default) partition: sbatch itself names that mistake
    _check_node_count(options.nodes, partition, sum(g.nodes for g in mine))
    fitting = [g for g in mine if g.cpus >= options.cpus and g.gpus >= options.gpus_per_node]
    if sum(g.nodes for g in fitting) < options.nodes:
        raise ConfigError(_too_big(options, partition, mine))


def _check_node_count(wanted: int, partition: str | None, available: int) -> None:
    if wanted > available:
        raise ConfigError(
            f"the job asks for {wanted} nodes but partition {partition} has {available}: "
            f"pass --nodes {available} or less (sbatch would leave the job pending for ever)"
        )


def _too_big(options: SbatchOptions, partition: str | None, groups: list[NodeGroup]) -> str:
    asked, largest = f"{options.cpus} CPUs", f"{max(g.cpus for g in groups)} CPUs"
    if options.gpus_per_node:
        asked += f" and {options.gpus_per_node} GPUs"
        largest += f" and {max(g.gpus for g in groups)} GPUs"
    return (
        f"the job asks each of its {options.nodes} node(s) for {asked}, but partition "
        f"{partition}'s nodes have at most {largest}: pass a smaller --cpus-per-task "
        "(default: 4 per worker), fewer workers (--nproc-per-node), or another --partition. "
        "sbatch would accept the job and leave it PENDING (Reason=PartitionConfig) for ever."
    )
