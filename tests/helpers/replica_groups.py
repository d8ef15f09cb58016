"""Replica groups in tests: a lighthouse, a group started as ``ddpkit run`` of
``tests/scripts/replica_group.py`` (on this machine or on a network-namespace host), and the
checks read from what each group recorded: every sample once an epoch, identical weights,
ddpkit's and torchft's step counts equal."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from helpers.jobs import kill_9, workers_of
from helpers.launch_helpers import REPO, SCRIPTS
from helpers.netns import VirtualHost

EPOCHS, SAMPLES = 20, 48  # replica_group.py's: 48 samples in batches of 4; 240 steps alone


def start_lighthouse(port: int = 0, min_groups: int = 1, host: VirtualHost | None = None
                     ) -> tuple[subprocess.Popen[str], str]:  # fmt: skip
    """``ddpkit lighthouse`` on ``port`` (0: a free one), a heartbeat timeout of 1 s, on
    loopback or on ``host`` (a network namespace, at its address); the server and its
    address. ``min_groups=2``: no quorum until both groups are there (on a
    loaded machine one group can start seconds after the other: a quorum of the first one
    alone would leave it waiting in an exchange the second never joins)."""
    bind = f"{host.address if host else '127.0.0.1'}:{port}"
    command = [sys.executable, "-m", "ddpkit", "lighthouse", "--bind", bind,
               "--heartbeat-timeout", "1", "--min-groups", str(min_groups)]  # fmt: skip
    command = host.command(*command) if host else command
    server = subprocess.Popen(command, cwd=REPO, text=True, stderr=subprocess.PIPE)
    assert server.stderr is not None
    said = next(line for line in server.stderr if "lighthouse at " in line)
    address = re.search(r"TORCHFT_LIGHTHOUSE=(\S+);", said)
    assert address, said
    threading.Thread(target=server.stderr.read, daemon=True).start()  # never a full pipe
    return server, address[1]


class Group:
    """One replica group: ``ddpkit run --nproc N`` of the script (1 process unless told;
    ``restarts``: torch's agent restarts its processes that often), its output in a file.
    ``host``: run it on that network-namespace host, with the environment a user there has
    (no GLOO_SOCKET_IFNAME: ddpkit picks the interface)."""

    def __init__(self, index: int, lighthouse: str, folder: Path, *face: str,
                 epochs: int = EPOCHS, nproc: int = 1, restarts: int = 0,
                 host: VirtualHost | None = None) -> None:  # fmt: skip
        self.index, self.out = index, folder / f"group{index}.pt"
        self.log = folder / f"group{index}-{time.monotonic_ns()}.log"
        env = {**os.environ, "DDPKIT_FT_GROUP": str(index), "TORCHFT_LIGHTHOUSE": lighthouse,
               "RUST_LOG": "warn"}  # fmt: skip
        if host:
            env.pop("GLOO_SOCKET_IFNAME", None)
        script = [str(SCRIPTS / "replica_group.py"), str(self.out), str(epochs), *face]
        command = [sys.executable, "-m", "ddpkit", "run", "--nproc", str(nproc),
                   "--max-restarts", str(restarts), *script]  # fmt: skip
        command = host.command(*command) if host else command
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        STARTED.append(self)

    def counts(self) -> list[tuple[int, int]]:
        """(ddpkit's step, torchft's step) after each batch."""
        found = re.findall(r"\] step (\d+) torchft (\d+)$", self.text(), re.M)
        return [(int(mine), int(theirs)) for mine, theirs in found]

    def steps(self) -> list[int]:
        return [mine for mine, _ in self.counts()]

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def trained(self) -> list[dict[str, Any]]:
        """Each committed step's line: epoch, step, groups in it, the samples trained here."""
        path = Path(f"{self.out}.trained.jsonl")
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def weights(self) -> dict[str, torch.Tensor]:
        return torch.load(self.out, weights_only=True)

    def finish(self, timeout: float) -> None:
        assert self.process.wait(timeout=timeout) == 0, self.text()[-3000:]


STARTED: list[Group] = []  # the groups a test started, stopped by its teardown


def stop_all() -> None:
    """Every group a test started that still runs, killed (a failed test leaves none behind)."""
    while STARTED:
        group = STARTED.pop()
        if group.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                kill_9(group.process, workers_of(group.process.pid))
            group.process.wait(timeout=30)


def each_sample_once(groups: list[Group], epochs: range, lost_in: dict[int, int]) -> None:
    """Every epoch's samples trained by the groups' committed steps together: none twice,
    none left out; ``lost_in``: epochs where a group killed between a committed step and its
    record may have left up to that many samples unrecorded."""
    for epoch in epochs:
        trained = [s for g in groups for line in g.trained() if line["epoch"] == epoch
                   for s in line["samples"]]  # fmt: skip
        twice = sorted(s for s in set(trained) if trained.count(s) > 1)
        missing = sorted(set(range(SAMPLES)) - set(trained))
        assert not twice, (epoch, twice)
        assert len(missing) <= lost_in.get(epoch, 0), (epoch, missing)


def unrecorded(survivor: Group, doomed: Group, nproc: int = 1) -> dict[int, int]:
    """Epochs where ``doomed`` may have left samples unrecorded, and how many: each step that
    ``survivor`` took with both groups and ``doomed`` recorded on fewer than its ``nproc``
    ranks (killed between the step's commit and its record; the step can be the first of
    the next epoch, so it is read from the survivor's record, not guessed from doomed's)."""
    lines: dict[int, int] = {}
    for line in doomed.trained():
        lines[line["step"]] = lines.get(line["step"], 0) + 1
    lost = {line["step"]: line["epoch"] for line in survivor.trained()
            if line["groups"] == 2 and lines.get(line["step"], 0) < nproc}  # fmt: skip
    assert len(lost) <= 1, lost  # a kill loses at most the record of the step it cut
    return {epoch: 4 * nproc for epoch in lost.values()}  # batches of 4 on each rank


def same_weights(*runs: dict[str, torch.Tensor]) -> bool:
    first = runs[0]
    return all(r.keys() == first.keys() and all(torch.equal(r[k], first[k]) for k in first)
               for r in runs[1:])  # fmt: skip


def steps_agree(group: Group) -> None:
    """ddpkit's step and torchft's step, equal after every batch: a dropped step counted by
    one and not the other would make a resumed group look ahead of its live peers."""
    counts = group.counts()
    assert counts and all(mine == theirs for mine, theirs in counts), counts
