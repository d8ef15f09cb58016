"""``ddpkit verify --replica-groups G`` (**experimental**): a fault-tolerant run of G replica
groups (``ReplicaGroups``), with no failure, against one process.

verify starts a torchft lighthouse of its own on loopback that forms the first step's quorum
only once all G groups have joined, then runs G ``ddpkit run`` jobs of N workers at once,
each with its group's name. The single process is one group of its own at a lighthouse of
its own, standing in for the G x N ranks: with ``ReplicaBatches`` it reads, at each step,
the slices every rank of every group reads together. Group 0's record stands for the run;
every group must end with the same weights, and the samples are those all groups trained.

Example::

    with lighthouse(2) as address:   # as ddpkit.tools.verify.runner.run_fault_tolerant does
        run_all(lambda g: run_side(config, out / f"group{g}", 1,
                                   extra_env=group_env(g, address)), 2)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ddpkit._core.protocol import FT_GROUP_ENV, LIGHTHOUSE_ENV
from ddpkit.faulttolerance.manager import import_torchft
from ddpkit.tools.verify.report import Finding

HEARTBEAT_TIMEOUT = 5.0  # s; no group fails here: a generous beat for a busy machine
JOIN_TIMEOUT = 60.0  # s; the first quorum waits for every group to start (torch's import, twice)


@contextmanager
def lighthouse(groups: int) -> Iterator[dict[str, str]]:
    """A lighthouse on loopback that waits for ``groups`` groups; its address as the
    environment a group needs (``TORCHFT_LIGHTHOUSE``).

    Example::

        with lighthouse(2) as env: ...   # {'TORCHFT_LIGHTHOUSE': 'http://127.0.0.1:41234'}
    """
    import_torchft("verify --replica-groups")
    from ddpkit.faulttolerance.heal import serve_lighthouse

    server = serve_lighthouse("127.0.0.1:0", groups, HEARTBEAT_TIMEOUT, JOIN_TIMEOUT)
    try:
        port = server.address().rsplit(":", 1)[1]
        yield {LIGHTHOUSE_ENV: f"http://127.0.0.1:{port}"}
    finally:
        server.shutdown()


def group_env(group: int | str, address: dict[str, str]) -> dict[str, str]:
    """A replica group's environment: its name and the lighthouse.

    Example:
        >>> group_env(1, {"TORCHFT_LIGHTHOUSE": "http://h:1"})[FT_GROUP_ENV]
        '1'
    """
    return {FT_GROUP_ENV: str(group), **address}


def run_all(run_group: Any, groups: int) -> list[Any]:
    """``run_group(g)`` for every group at once (they meet at each step); their results.

    Example:
        >>> run_all(lambda g: g * 10, 3)
        [0, 10, 20]
    """
    with ThreadPoolExecutor(max_workers=groups) as pool:
        return list(pool.map(run_group, range(groups)))


def merged_record(records: list[dict[str, Any]], finals: list[dict[str, torch.Tensor]]
                  ) -> dict[str, Any]:  # fmt: skip
    """Group 0's record for the run: the global batch over every group, the samples every
    group trained, and which groups ended with other weights than group 0.

    Example:
        >>> rec = {"setup": {"global_batch": 8}, "samples": {"1": [5, 6]}}
        >>> w = {"w": torch.ones(1)}
        >>> merged = merged_record([rec, {**rec, "samples": {"2": [7, 8]}}], [w, w])
        >>> merged["setup"]["global_batch"], sorted(merged["samples"]), merged["groups"]
        (16, ['1', '2'], {'count': 2, 'differ': [], 'tensors': []})
    """
    first = records[0]
    setup = dict(first["setup"])
    if setup.get("global_batch") is not None:
        setup["global_batch"] *= len(records)  # each group's batch, in every group
    samples: dict[str, Any] = {}
    for record in records:
        samples.update(record["samples"])
    unequal = [[name for name, tensor in finals[0].items() if not torch.equal(final[name], tensor)]
               for final in finals]  # fmt: skip
    differ = [group for group, names in enumerate(unequal) if names]
    groups = {"count": len(records), "differ": differ, "tensors": sorted(set().union(*unequal))}
    return {**first, "setup": setup, "samples": samples, "groups": groups}


def killed_and_healed(log: Path, group: int, step: int) -> tuple[bool, str]:
    """Whether the group killed after ``step`` was started again by torch's agent and healed
    from a live group, read from its output (``log``): verify's ``killed`` line.

    Example::

        killed_and_healed(out / "group1" / "output.log", 1, 6)
        # (True, 'group 1: a process killed (-9) after step 6, started again (restart 1 ...')
    """
    text = log.read_text(errors="replace") if log.is_file() else ""
    restarted = re.search(r"restart (\d+) of (\d+)", text)
    healed = re.search(r"healed at step (\d+) \(was at step \d+\)", text)
    said = f"group {group}: a process killed (-9) after step {step}"
    if restarted and healed:
        return True, (f"{said}, started again ({restarted[0]}), healed at step {healed[1]} "
                      "from a live group")  # fmt: skip
    missing = "never started again" if not restarted else "never healed from a live group"
    return False, f"{said}, {missing}: the failure was not recovered from ({log})"


def groups_finding(record: dict[str, Any]) -> Finding:
    """The line that says whether the replica groups ended identical.

    Example:
        >>> groups_finding({"groups": {"count": 2, "differ": [], "tensors": []}}).text
        '2 replica groups ended with identical weights'
    """
    groups = record["groups"]
    if not groups["differ"]:
        return Finding("groups", True, f"{groups['count']} replica groups ended with "
                                       "identical weights")  # fmt: skip
    shown = ", ".join(groups["tensors"][:5])
    which = ", ".join(map(str, groups["differ"]))
    return Finding("groups", False, f"replica group(s) {which} ended with other weights than "
                                    f"group 0 in {shown}: the groups did not average "
                                    "their gradients alike")  # fmt: skip
