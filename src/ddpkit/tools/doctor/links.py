"""``ddpkit doctor --nodes``: every link between the job's hosts measured, and a bad one named.

Run on every host of a job, one process per host (more per host work too: the first rank of
each host speaks for it)::

    ddpkit run --nnodes 3 --node-rank N --master 10.0.0.1:29500 --nproc 1 -m ddpkit doctor --nodes
    srun --nodes 3 --ntasks-per-node 1 python -m ddpkit doctor --nodes

Each host is known by the address it reaches the master from (and its host name). For each
pair of hosts in turn, the two exchange small messages (latency: half the shortest round
trip) and ``--link-mib`` MiB messages (bandwidth each way, from the fastest round trip) with
torch.distributed's send and recv, over the job's backend (gloo's TCP, or NCCL between GPUs),
while every other rank waits; then one all_reduce of the same size runs over every rank. The
best of several trips, because a busy host slows some trips and a bad link slows them all.
Rank 0 prints the table and names:

- a **slow host**: its links' median bandwidth is under a third of the median of the links
  between the other hosts, or their latency over 3 times it (and 1 ms more), so a host on a
  bad port or cable is named once rather than as each of its links;
- a **slow link**: after that, a link under a third of the median of the rest (a bad path
  between two otherwise good hosts).

Example:
    >>> links = [Link("a", "b", 0.1, 900.0), Link("a", "c", 0.1, 12.0), Link("b", "c", 0.1, 11.0)]
    >>> [finding.describe() for finding in find_slow(["a", "b", "c"], links)]
    ['slow host c: its links 11.5 MB/s and 0.10 ms, the others 900.0 MB/s and 0.10 ms']
"""

from __future__ import annotations

import itertools
import socket
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from ddpkit._core.system import route_to
from ddpkit.errors import ConfigError

SLOWER = 3.0  # a host or link this many times slower than the others is named
MIN_EXTRA_LATENCY_MS = 1.0
LATENCY_TRIPS = 20
BANDWIDTH_TRIPS = 5


@dataclass(frozen=True)
class Link:
    """One measured link: one-way latency (ms) and bandwidth each way (MB/s).

    Example:
        >>> Link("10.0.0.1", "10.0.0.2", 0.05, 1100.0).describe()
        '10.0.0.1 <-> 10.0.0.2: 1100.0 MB/s, 0.05 ms'
    """

    a: str
    b: str
    latency_ms: float
    mb_per_s: float

    def describe(self) -> str:
        """``a <-> b: 1100.0 MB/s, 0.05 ms``."""
        return f"{self.a} <-> {self.b}: {self.mb_per_s:.1f} MB/s, {self.latency_ms:.2f} ms"


@dataclass(frozen=True)
class Finding:
    """A slow host or link, with its figures and the others'.

    Example:
        >>> Finding("link", "a <-> b", 12.0, 0.1, 900.0, 0.1).describe()
        'slow link a <-> b: 12.0 MB/s and 0.10 ms, the others 900.0 MB/s and 0.10 ms'
    """

    kind: str  # "host" or "link"
    name: str
    mb_per_s: float
    latency_ms: float
    others_mb_per_s: float
    others_latency_ms: float

    def describe(self) -> str:
        """``slow host c: its links 12.0 MB/s and 0.10 ms, the others ...``."""
        its = "its links " if self.kind == "host" else ""
        return (
            f"slow {self.kind} {self.name}: {its}{self.mb_per_s:.1f} MB/s and "
            f"{self.latency_ms:.2f} ms, the others {self.others_mb_per_s:.1f} MB/s and "
            f"{self.others_latency_ms:.2f} ms"
        )


def find_slow(hosts: list[str], links: list[Link]) -> list[Finding]:
    """The slow hosts, then the slow links between the others (module docstring)."""
    findings = []
    for host in hosts:
        mine = [link for link in links if host in (link.a, link.b)]
        others = [link for link in links if host not in (link.a, link.b)]
        if mine and others and _slower(mine, others):
            findings.append(Finding("host", host, *_medians(mine), *_medians(others)))
    slow_hosts = {finding.name for finding in findings}
    rest = [link for link in links if not {link.a, link.b} & slow_hosts]
    for link in rest:
        others = [other for other in rest if other is not link]
        if others and _slower([link], others):
            findings.append(Finding("link", f"{link.a} <-> {link.b}", *_medians([link]),
                                    *_medians(others)))  # fmt: skip
    return findings


def _slower(mine: list[Link], others: list[Link]) -> bool:
    bandwidth, latency = _medians(mine)
    others_bandwidth, others_latency = _medians(others)
    slow_latency = latency > max(SLOWER * others_latency, others_latency + MIN_EXTRA_LATENCY_MS)
    return bandwidth * SLOWER < others_bandwidth or slow_latency


def _medians(links: list[Link]) -> tuple[float, float]:
    bandwidth = statistics.median(link.mb_per_s for link in links)
    return bandwidth, statistics.median(link.latency_ms for link in links)


def measure_links(nbytes: int) -> dict[str, Any] | None:
    """Join the job, measure every pair of hosts and one all_reduce; rank 0's results.

    Example::

        measure_links(16 * 2**20)["findings"]   # [] on a healthy cluster
    """
    import ddpkit

    world = ddpkit.init(hang_timeout=0)
    if not dist.is_initialized():
        raise ConfigError(
            "doctor --nodes measures the links between the hosts of a job: start it on every "
            "host, one process each: ddpkit run --nnodes H --node-rank N --master HOST:PORT "
            "--nproc 1 -m ddpkit doctor --nodes (or in a SLURM allocation: srun "
            "--ntasks-per-node 1 python -m ddpkit doctor --nodes)"
        )
    hosts = _gather_hosts(_host_name(world.master_addr), world.device)
    leaders = {host: hosts.index(host) for host in dict.fromkeys(hosts)}  # first rank of each
    links = _measure_pairs(leaders, world.rank, nbytes, world.device)
    group = _time_all_reduce(nbytes, world.device)
    if not world.is_main:
        return None
    return {
        "hosts": list(leaders),
        "backend": world.backend,
        "bytes": nbytes,
        "links": [asdict(link) for link in links],
        "all_reduce": {"ranks": world.world_size, **group},
        "findings": [asdict(finding) for finding in find_slow(list(leaders), links)],
    }


def _measure_pairs(leaders: dict[str, int], rank: int, nbytes: int,
                   device: torch.device) -> list[Link]:  # fmt: skip
    """Each pair of hosts in turn, their leaders exchanging while every other rank waits;
    every rank gets every pair's figures (from the pair's first leader)."""
    pairs = list(itertools.combinations(leaders, 2))
    figures = torch.zeros(len(pairs), 2, dtype=torch.float64, device=device)  # ms, MB/s
    for index, (a, b) in enumerate(pairs):
        if rank in (leaders[a], leaders[b]):
            first = rank == leaders[a]
            measured = _exchange(leaders[b] if first else leaders[a], first, nbytes, device)
            if first:
                figures[index] = torch.tensor(measured, dtype=torch.float64, device=device)
        dist.barrier()
    dist.all_reduce(figures)  # on the backend's device: NCCL moves CUDA tensors only
    return [Link(a, b, *figures[i].tolist()) for i, (a, b) in enumerate(pairs)]


def _exchange(peer: int, first: bool, nbytes: int, device: torch.device) -> tuple[float, float]:
    """Ping-pong with ``peer``: (one-way latency ms, MB/s each way); ``first`` sends first."""
    small = torch.zeros(1, dtype=torch.float32, device=device)
    trips = [_round_trip(small, peer, first) for _ in range(LATENCY_TRIPS + 2)][2:]
    large = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    _round_trip(large, peer, first)  # warm-up: buffers, connections
    seconds = min(_round_trip(large, peer, first) for _ in range(BANDWIDTH_TRIPS))
    return min(trips) / 2 * 1000, nbytes / (seconds / 2) / 1e6


def _round_trip(tensor: torch.Tensor, peer: int, first: bool) -> float:
    start = time.perf_counter()
    if first:
        dist.send(tensor, peer)
        dist.recv(tensor, peer)
    else:
        dist.recv(tensor, peer)
        dist.send(tensor, peer)
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)
    return time.perf_counter() - start


def _time_all_reduce(nbytes: int, device: torch.device) -> dict[str, float]:
    tensor = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    dist.all_reduce(tensor)
    start = time.perf_counter()
    for _ in range(BANDWIDTH_TRIPS):
        dist.all_reduce(tensor)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - start) / BANDWIDTH_TRIPS
    return {"time_ms": seconds * 1000, "mb_per_s": nbytes / seconds / 1e6}


def _host_name(master: str | None) -> str:
    """``hostname (address)``: the address this host reaches the master from."""
    address, _ = route_to(master or "127.0.0.1")
    return f"{socket.gethostname()} ({address})"


def _gather_hosts(mine: str, device: torch.device) -> list[str]:
    """Every rank's host name, by rank (fixed-size rows: one all_gather)."""
    name = list(mine.encode()[:128].ljust(128, b"\0"))
    row = torch.tensor(name, dtype=torch.uint8, device=device)
    rows = [torch.empty_like(row) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, row)
    return [bytes(r.cpu().tolist()).rstrip(b"\0").decode(errors="replace") for r in rows]


def table(results: dict[str, Any]) -> list[str]:
    """The report's lines: each link, the all_reduce, the findings (or that all is well).

    Example:
        >>> table({"hosts": ["a", "b"], "backend": "gloo", "bytes": 2**20, "links": [
        ...     {"a": "a", "b": "b", "latency_ms": 0.1, "mb_per_s": 900.0}], "findings": [],
        ...     "all_reduce": {"ranks": 2, "time_ms": 1.0, "mb_per_s": 1000.0}})[-1]
        'PASS one link, nothing to compare it with: with 3 hosts or more, a slow one is named'
    """
    lines = [f"links between {len(results['hosts'])} hosts ({results['backend']}, "
             f"{results['bytes'] / 2**20:g} MiB messages):"]  # fmt: skip
    lines += [f"  {Link(**link).describe()}" for link in results["links"]]
    group = results["all_reduce"]
    lines.append(f"  all_reduce over {group['ranks']} ranks: {group['time_ms']:.2f} ms, "
                 f"{group['mb_per_s']:.1f} MB/s")  # fmt: skip
    findings = [Finding(**finding).describe() for finding in results["findings"]]
    if len(results["hosts"]) < 2:
        return [*lines, f"SKIP one host in this job ({results['hosts'][0]}): start it on every "
                "host, one process each, to measure the links between them"]  # fmt: skip
    if len(results["hosts"]) == 2 and not findings:
        return [*lines, "PASS one link, nothing to compare it with: with 3 hosts or more, a "
                "slow one is named"]  # fmt: skip
    if not findings:
        return [*lines, f"PASS every link within {SLOWER:g}x of the others"]
    return [*lines, *(f"FAIL {finding}" for finding in findings)]
