"""**Experimental** FaultTolerantStrategy (torchft): two replica groups of one process each,
a lighthouse, one group killed with -9 mid-run. The other trains on without a restart (its
step count never goes back), the killed one is started again and heals from it, every batch
is trained on once per epoch whichever groups were alive (ReplicaBatches), and both end with
identical weights."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ddpkit._core.system import route_to
from helpers.jobs import kill_9, wait_until, workers_of
from helpers.launch_helpers import REPO, SCRIPTS

torchft = pytest.importorskip("torchft", reason="pip install 'ddpkit[ft]'")
pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(240)]

EPOCHS, BATCHES = 20, 12  # replica_group.py's: 48 samples in batches of 4; 240 steps alone


def start_lighthouse(port: int = 0) -> tuple[subprocess.Popen[str], str]:
    """``ddpkit lighthouse`` on ``port`` (0: a free one), a heartbeat timeout of 1 s; the
    server and its address."""
    command = [sys.executable, "-m", "ddpkit", "lighthouse", "--bind", f"127.0.0.1:{port}",
               "--heartbeat-ms", "1000"]  # fmt: skip
    server = subprocess.Popen(command, cwd=REPO, text=True, stderr=subprocess.PIPE)
    assert server.stderr is not None
    said = next(line for line in server.stderr if "lighthouse at " in line)
    address = re.search(r"TORCHFT_LIGHTHOUSE=(\S+);", said)
    assert address, said
    threading.Thread(target=server.stderr.read, daemon=True).start()  # never a full pipe
    return server, address[1]


@pytest.fixture
def lighthouse() -> Iterator[str]:
    """A lighthouse for the test; its address."""
    server, address = start_lighthouse()
    yield address
    server.terminate()  # SIGTERM: it stops and says nothing more
    assert server.wait(timeout=30) == 0


class Group:
    """One replica group: ``ddpkit run --nproc 1`` of the script, its output in a file."""

    def __init__(self, index: int, lighthouse: str, folder: Path, *face: str) -> None:
        self.index, self.out = index, folder / f"group{index}.pt"
        self.log = folder / f"group{index}-{time.monotonic_ns()}.log"
        env = {**os.environ, "DDPKIT_FT_GROUP": str(index), "TORCHFT_LIGHTHOUSE": lighthouse,
               "RUST_LOG": "warn"}  # fmt: skip
        script = [str(SCRIPTS / "replica_group.py"), str(self.out), str(EPOCHS), *face]
        command = [sys.executable, "-m", "ddpkit", "run", "--nproc", "1", *script]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def steps(self) -> list[int]:
        return [int(n) for n in re.findall(r"\] step (\d+)$", self.text(), re.M)]

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def test_a_killed_group_leaves_the_other_training_and_heals_when_back(
    lighthouse: str, tmp_path: Path
) -> None:
    survivor = Group(0, lighthouse, tmp_path)  # first: its record then holds every step
    wait_until(lambda: bool(survivor.steps()), 120, "group 0's first step")
    doomed = Group(1, lighthouse, tmp_path)  # it heals from group 0 on joining
    wait_until(lambda: len(doomed.steps()) >= 6, 120, "group 1 training beside group 0")
    kill_9(doomed.process, workers_of(doomed.process.pid))
    at_kill = max(survivor.steps())
    wait_until(lambda: max(survivor.steps()) >= at_kill + 10, 60, "group 0 training alone")
    said = "with 1 replica group(s) (was 2): group 1 left (silent past the lighthouse's"
    assert said in survivor.text(), survivor.text()[-3000:]
    back = Group(1, lighthouse, tmp_path)
    assert survivor.process.wait(timeout=120) == 0, survivor.text()[-3000:]
    assert back.process.wait(timeout=60) == 0, back.text()[-3000:]
    steps = survivor.steps()
    assert steps == sorted(steps), steps  # never went back
    healed = re.search(r"healed at step \d+ \(was at step 0\): the run's state from the "
                       r"group at place \d of the quorum, on (\S+), over ([\d.]+) \((\w+)\): "
                       r"([\d.]+) MiB in ([\d.]+) s", back.text())  # fmt: skip
    assert healed and float(healed[4]) > 0, back.text()[-3000:]
    assert healed[3] == route_to(healed[1])[1]  # the interface the peer is reached over
    assert back.steps()[0] > at_kill, (back.steps()[0], at_kill)  # it took up the run there
    final = [torch.load(g.out, weights_only=True) for g in (survivor, back)]
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(final[0][name], final[1][name]) for name in final[0])
    # The survivor saw every committed step of the job: each batch once in each epoch,
    # those of the steps group 1 died in dealt again (its record ends where it rejoined).
    record = json.loads(Path(f"{survivor.out}.json").read_text())
    assert record["epochs"] == EPOCHS
    for epoch in range(EPOCHS):
        done = sorted(b for e, batches in record["record"] if e == epoch for b in batches)
        assert done == list(range(BATCHES)), (epoch, done)
    rejoined = json.loads(Path(f"{back.out}.json").read_text())["record"]
    assert rejoined == record["record"][-len(rejoined) :]  # the same ledger since it healed


def test_the_trainer_trains_replica_groups_as_trainloop_does(
    lighthouse: str, tmp_path: Path
) -> None:
    """The other face, no failure: two groups through Trainer.fit end identical, every
    batch trained once per epoch between them."""
    groups = [Group(g, lighthouse, tmp_path, "trainer") for g in (0, 1)]
    for group in groups:
        assert group.process.wait(timeout=180) == 0, group.text()[-3000:]
    final = [torch.load(g.out, weights_only=True) for g in groups]
    assert all(torch.equal(final[0][name], final[1][name]) for name in final[0])
    records = [json.loads(Path(f"{g.out}.json").read_text()) for g in groups]
    assert records[0]["epochs"] == records[1]["epochs"] == EPOCHS
    # Whichever group started first saw every step; the other healed from it on joining, and
    # its record is the end of the first one's.
    whole, joined = sorted((r["record"] for r in records), key=len, reverse=True)
    assert joined == whole[len(whole) - len(joined) :]
    for epoch in range(EPOCHS):
        done = sorted(b for e, batches in whole if e == epoch for b in batches)
        assert done == list(range(BATCHES)), (epoch, done)


def test_a_short_lighthouse_outage_is_ridden_out(tmp_path: Path) -> None:
    """The lighthouse killed with -9 mid-run and started again on its port 3 s later: both
    groups go on (torchft's quorum retries) and end identical, every batch once an epoch."""
    server, address = start_lighthouse()
    groups = [Group(g, address, tmp_path, "patient") for g in (0, 1)]
    wait_until(lambda: all(len(g.steps()) >= 5 for g in groups), 120, "both groups training")
    server.kill()
    server.wait()
    time.sleep(3)
    server, _ = start_lighthouse(int(address.rsplit(":", 1)[1]))
    try:
        for group in groups:
            assert group.process.wait(timeout=180) == 0, group.text()[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    final = [torch.load(g.out, weights_only=True) for g in groups]
    assert all(torch.equal(final[0][name], final[1][name]) for name in final[0])
    # A group that falls behind in the outage heals and misses a few steps of the record:
    # no batch twice in either group's record, and every batch in one or the other.
    records = [json.loads(Path(f"{g.out}.json").read_text())["record"] for g in groups]
    for epoch in range(EPOCHS):
        seen = [[b for e, batches in record if e == epoch for b in batches] for record in records]
        assert all(len(s) == len(set(s)) for s in seen), (epoch, seen)
        assert set(seen[0]) | set(seen[1]) == set(range(BATCHES)), (epoch, seen)


@pytest.mark.parametrize("workers", [1, 2])
def test_verify_finds_replica_groups_compute_what_one_process_computes(workers: int) -> None:
    """No failure: G groups of N workers against one process, the epoch's short last step
    (142 samples in batches of 8) included."""
    command = [sys.executable, "-m", "ddpkit", "verify", "examples/fault_tolerant.py",
               "--replica-groups", "2", "--workers", str(workers), "--steps", "12"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert f"PASS: 2 replica groups of {workers} worker" in done.stdout
    assert re.search(r"data +142 samples trained on, identical", done.stdout), done.stdout
    assert "2 replica groups ended with identical weights" in done.stdout


def test_losing_every_group_resumes_from_the_checkpoints_not_from_step_0(tmp_path: Path) -> None:
    """Both groups killed with -9 mid-run, group 1's newest checkpoint lost, both started
    again: each resumes from its last checkpoint (every 5 steps, mid-epoch included), group
    1 heals from group 0, which is ahead, and both train on together and end identical."""
    server, address = start_lighthouse()
    try:
        groups = [Group(g, address, tmp_path, "resumable") for g in (0, 1)]
        wait_until(lambda: all(len(g.steps()) >= 20 for g in groups), 120, "both training")
        for group in groups:
            kill_9(group.process, workers_of(group.process.pid))
        at_kill = max(max(g.steps()) for g in groups)
        newest = sorted(Path(f"{groups[1].out}.ckpt").glob("epoch_*.pt"))[-1]
        newest.unlink()  # group 1 resumes from an older checkpoint than group 0's
        again = [Group(0, address, tmp_path, "resumable")]
        wait_until(lambda: bool(again[0].steps()), 120, "group 0 training again")
        again.append(Group(1, address, tmp_path, "resumable"))  # joins group 0, which is ahead
        for group in again:
            assert group.process.wait(timeout=180) == 0, group.text()[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    first, healed_at = (group.steps()[0] for group in again)
    assert at_kill - 10 < first <= at_kill + 1, (first, at_kill)  # group 0's own checkpoint
    # group 1 takes up the run wherever group 0 had got to when it joined, not at its own
    # older checkpoint
    assert first <= healed_at <= max(again[0].steps()), (healed_at, first)
    assert "healed at step" in again[1].text(), again[1].text()[-3000:]
    final = [torch.load(g.out, weights_only=True) for g in again]
    assert all(torch.equal(final[0][name], final[1][name]) for name in final[0])
    records = [json.loads(Path(f"{g.out}.json").read_text())["record"] for g in again]
    both_since = max(record[0][0] for record in records) + 1  # whole epochs since group 1 joined
    for epoch in range(both_since, EPOCHS):
        seen = [[b for e, batches in record if e == epoch for b in batches] for record in records]
        assert all(sorted(s) == list(range(BATCHES)) for s in seen), (epoch, seen)
