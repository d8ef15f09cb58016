"""A dry run's plan: what one rank holds and sends per step, and the time its collectives
cannot go under on a given link.

The time is the ring bound (the standard cost model, e.g. Thakur, Rabenseifner & Gropp 2005;
Patarasuk & Yuan 2009): over a group of n ranks, a ring all-reduce of S bytes moves
2(n-1)/n * S through each rank's link in 2(n-1) hops; an all-gather that produces S bytes,
or a reduce-scatter of S bytes, (n-1)/n * S in n-1 hops; a pipelined broadcast S in n-1
hops. Each hop also pays the link's latency. Overlap with compute, and NCCL's trees (log n
hops), are left out: it is the time a step's communication takes unless its bytes shrink.

Example:
    >>> link = Link(bandwidth=25e9, latency=5e-6)
    >>> c = Collective(Kind.ALL_REDUCE, 100_000_000, group_size=1024, step=1, source="DDP")
    >>> round(ring_seconds(c, link) * 1000, 2)   # 2*1023/1024 * 100 MB at 25 GB/s + 2046 hops
    18.22
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Kind(enum.Enum):
    """What a collective does (each has its ring cost).

    Example:
        >>> Kind("all_gather").label
        'all-gather'
    """

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    OTHER = "other"

    @property
    def label(self) -> str:
        """How a report names it."""
        return self.value.replace("_", "-")


def _ring(kind: Kind, n: int) -> tuple[int, float]:
    """(hops, the share of S each rank's link carries) over a group of n ranks."""
    if kind is Kind.ALL_REDUCE:
        return 2 * (n - 1), 2 * (n - 1) / n
    if kind is Kind.BROADCAST:
        return n - 1, 1.0
    return n - 1, (n - 1) / n  # all-gather, reduce-scatter (and anything else, as they)


@dataclass(frozen=True)
class Collective:
    """One collective rank 0 issued: its kind, its size S in bytes (all-gather: the gathered
    output; reduce-scatter: the input; all-reduce and broadcast: the tensors), the size of
    its group, the step it was issued in (0: before the first step) and who issued it.

    Example:
        >>> Collective(Kind.ALL_GATHER, 4096, 8, 1, "c10d._allgather_base_").kind.label
        'all-gather'
    """

    kind: Kind
    bytes: int
    group_size: int
    step: int
    source: str


@dataclass(frozen=True)
class Link:
    """One rank's link: ``bandwidth`` in bytes per second each way, ``latency`` in seconds.

    Example:
        >>> Link(bandwidth=25e9, latency=5e-6).bandwidth
        25000000000.0
    """

    bandwidth: float
    latency: float


def ring_seconds(collective: Collective, link: Link) -> float:
    """The ring bound of one collective on ``link`` (0 for a group of one).

    Example:
        >>> ring_seconds(Collective(Kind.BROADCAST, 10**9, 1, 0, "x"), Link(1e9, 0.0))
        0.0
    """
    n = collective.group_size
    if n <= 1:
        return 0.0
    hops, share = _ring(collective.kind, n)
    return share * collective.bytes / link.bandwidth + hops * link.latency


@dataclass
class Memory:
    """What one rank holds, in bytes: its parameters (its shards, where sharded), their
    gradients, the optimizer's state, and communication buffers (DDP's gradient buckets
    where they are not the gradients themselves; FSDP's largest gathered unit).

    Example:
        >>> Memory(parameters=4, gradients=4, optimizer=8).total
        16
    """

    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    buffers: int = 0
    device_peak: int | None = None  # the dry run's peak on a GPU, activations included

    @property
    def total(self) -> int:
        """Everything counted but activations."""
        return self.parameters + self.gradients + self.optimizer + self.buffers


@dataclass
class Plan:
    """One dry run: the world it stood in, rank 0's memory and every collective it issued.

    Example:
        >>> Plan(world_size=8, per_node=8, strategy="ddp", steps=2).per_step()
        []
    """

    world_size: int
    per_node: int
    strategy: str
    steps: int  # the optimizer steps the dry run took
    parameters: int = 0  # the model's, in all (not only this rank's shards)
    memory: Memory = field(default_factory=Memory)
    collectives: list[Collective] = field(default_factory=list)

    def per_step(self) -> list[Collective]:
        """The collectives of the last full step: one step's worth, the set-up left out."""
        return [c for c in self.collectives if c.step == self.steps and c.step > 0]

    def to_json(self) -> dict[str, Any]:
        """Plain data, as ``--json`` writes it.

        Example:
            >>> Plan(8, 8, "ddp", 1).to_json()["memory"]["parameters"]
            0
        """
        data = asdict(self)
        data["collectives"] = [{**asdict(c), "kind": c.kind.value} for c in self.collectives]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        """The plan :meth:`to_json` wrote.

        Example:
            >>> Plan.from_json(Plan(8, 8, "ddp", 1).to_json()).world_size
            8
        """
        calls = [Collective(**{**c, "kind": Kind(c["kind"])}) for c in data["collectives"]]
        fields = {k: v for k, v in data.items() if k not in ("memory", "collectives")}
        return cls(**fields, memory=Memory(**data["memory"]), collectives=calls)


def step_seconds(plan: Plan, link: Link) -> tuple[float, float]:
    """One step's communication on ``link``: (the bandwidth part, the latency part).

    Example:
        >>> step_seconds(Plan(8, 8, "ddp", 1), Link(1e9, 1e-6))
        (0.0, 0.0)
    """
    no_latency = Link(link.bandwidth, 0.0)
    calls = plan.per_step()
    moving = sum((ring_seconds(c, no_latency) for c in calls), 0.0)
    return moving, sum((ring_seconds(c, link) for c in calls), 0.0) - moving
