"""**Experimental** ReplicaGroups (torchft): two replica groups of one process each,
a lighthouse, one group killed with -9 mid-run. The other trains on without a restart (its
step count never goes back), the killed one is started again and heals from it, every sample
is trained on once per epoch whichever groups were alive (ReplicaBatches; read from the
samples each committed step trained, not from the ledger), and both end with identical
weights. Steps a quorum of 2 took are counted, not assumed: fixed seeds make two groups that
never met end identical too. A dropped step moves nothing on: the run ends as without it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ddpkit._core.system import route_to
from helpers.jobs import kill_9, wait_until, workers_of
from helpers.launch_helpers import REPO
from helpers.replica_groups import (
    EPOCHS,
    Group,
    each_sample_once,
    same_weights,
    start_lighthouse,
    steps_agree,
    unrecorded,
)

torchft = pytest.importorskip("torchft", reason="pip install 'ddpkit[ft]'")
# Each test's timeout is over the sum of its own waits (a slow machine fails a wait, with the
# group's output, before pytest-timeout cuts it short without it).
pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(360)]

SHORT = 5  # epochs of the runs compared with a reference run (6 steps each with 2 groups)
# Runs whose every step needs both groups: the lighthouse forms no quorum of one, and a
# group waits up to a minute for the other to start (seconds apart on a loaded machine).
BOTH = ["--min-groups", "2", "--timeout", "60"]


@pytest.fixture
def lighthouse() -> Iterator[str]:
    """A lighthouse for the test; its address."""
    server, address = start_lighthouse()
    yield address
    server.terminate()  # SIGTERM: it stops and says nothing more
    assert server.wait(timeout=30) == 0


@pytest.fixture
def lighthouse_of_two() -> Iterator[str]:
    """A lighthouse whose quorums hold both groups (each step by the two of them)."""
    server, address = start_lighthouse(min_groups=2)
    yield address
    server.terminate()
    assert server.wait(timeout=30) == 0


@pytest.mark.timeout(420)  # its waits: 370 s at most
def test_a_killed_group_leaves_the_other_training_and_heals_when_back(
    lighthouse: str, tmp_path: Path
) -> None:
    hold = tmp_path / "hold"  # group 0 waits there for group 1 to be back, not ending first
    survivor = Group(0, lighthouse, tmp_path, "--hold", str(hold))
    wait_until(lambda: bool(survivor.steps()), 90, "group 0's first step")
    doomed = Group(1, lighthouse, tmp_path)  # it heals from group 0 on joining
    wait_until(lambda: sum(line["groups"] == 2 for line in doomed.trained()) >= 6, 60,
               "group 1 training beside group 0, a quorum of 2")  # fmt: skip
    kill_9(doomed.process, workers_of(doomed.process.pid))
    at_kill = max(survivor.steps())
    hold.write_text(str(at_kill + 10))
    wait_until(lambda: max(survivor.steps()) >= at_kill + 10, 40, "group 0 training alone")
    said = "with 1 replica group(s) (was 2): group 1 left (silent past the lighthouse's"
    assert said in survivor.text(), survivor.text()[-3000:]
    back = Group(1, lighthouse, tmp_path)
    wait_until(lambda: "fault-tolerant across groups" in back.text(), 60, "group 1 back")
    Path(f"{hold}.go").touch()
    survivor.finish(timeout=90)
    back.finish(timeout=30)
    steps = survivor.steps()
    assert steps == sorted(steps), steps  # never went back
    healed = re.search(r"healed at step \d+ \(was at step 0\): the run's state from the "
                       r"group at place \d of the quorum, on (\S+), over ([\d.]+) \((\w+)\): "
                       r"([\d.]+) MiB in ([\d.]+) s", back.text())  # fmt: skip
    assert healed and float(healed[4]) > 0, back.text()[-3000:]
    assert healed[3] == route_to(healed[1])[1]  # the interface the peer is reached over
    assert back.steps()[0] > at_kill, (back.steps()[0], at_kill)  # it took up the run there
    assert same_weights(survivor.weights(), back.weights())
    steps_agree(survivor)
    # What the groups trained, read from the samples each batch carried: each once in
    # each epoch, whichever groups were alive (group 1's record lost at most its last step)
    assert json.loads(Path(f"{survivor.out}.json").read_text())["epochs"] == EPOCHS
    each_sample_once([survivor, back], range(EPOCHS), lost_in=unrecorded(survivor, back))


@pytest.mark.timeout(420)  # its waits: 390 s at most
def test_a_group_of_two_fsdp_processes_loses_one_and_heals_its_shards_from_a_peer(
    lighthouse: str, tmp_path: Path
) -> None:
    """Groups of 2 processes, FSDP inside each: one process of group 1 killed with -9.
    torch's agent restarts group 1's processes (--max-restarts 1), which resume from their
    memory snapshot (a step at most as far as group 0's at the kill) and heal, each rank its
    own shards from the same rank of group 0, which trained on alone meanwhile; both end
    with identical weights and every sample once an epoch."""
    hold = tmp_path / "hold"  # group 0 waits there until group 1 is back
    # A killed process's peer in its group lives on (and its group looks alive to the
    # lighthouse) until torch's agent stops it: the survivor waits up to 60 s for a quorum.
    go = tmp_path / "go"  # both groups started: they train together from the first step
    fsdp = ("--strategy", "fsdp", "--timeout", "60", "--start-after", str(go))
    survivor = Group(0, lighthouse, tmp_path, "--hold", str(hold), *fsdp, nproc=2)
    join = tmp_path / "join"  # group 1 joins the groups once it exists
    join.touch()
    doomed = Group(1, lighthouse, tmp_path, *fsdp, "--join-after", str(join), nproc=2,
                   restarts=1)  # fmt: skip
    started = lambda g: "fault-tolerant across groups" in g.text()  # noqa: E731
    wait_until(lambda: started(survivor) and started(doomed), 120, "both groups started")
    go.touch()
    wait_until(lambda: sum(line["groups"] == 2 for line in doomed.trained()) >= 6, 90,
               "group 1 training beside group 0, a quorum of 2")  # fmt: skip
    os.kill(workers_of(doomed.process.pid)[-1], signal.SIGKILL)  # one process of the two
    # Warm workers are back within a second: group 1 would rejoin the quorum group 0 waits
    # for (its killed process's peer lingers until the agent stops it), and both would go
    # on from the same step, with nothing to heal. Held out, it comes back as a slow one.
    join.unlink()
    last_step = lambda g: max(line["step"] for line in g.trained())  # noqa: E731
    at_kill = last_step(survivor)  # its record, not its lagging log
    hold.write_text(str(at_kill + 6))
    wait_until(lambda: last_step(survivor) >= at_kill + 6, 120, "group 0 training alone")
    wait_until(lambda: "restart 1 of 1" in doomed.text(), 90,
               "group 1's processes started again by torch's agent")  # fmt: skip
    Path(f"{hold}.go").touch()
    join.touch()
    survivor.finish(timeout=150)
    doomed.finish(timeout=60)
    steps = survivor.steps()
    assert steps == sorted(steps), steps  # group 0 never went back
    resumed = re.search(r"resumed from memory at step (\d+)", doomed.text())
    assert resumed and int(resumed[1]) <= at_kill, doomed.text()[-3000:]
    healed = re.search(r"healed at step (\d+) \(was at step (\d+)\)", doomed.text())
    assert healed and healed[2] == resumed[1], doomed.text()[-3000:]  # from where it resumed
    assert int(healed[1]) > at_kill + 6, (healed[1], at_kill)  # to where group 0 had gone
    assert same_weights(survivor.weights(), doomed.weights())
    steps_agree(survivor)
    each_sample_once([survivor, doomed], range(EPOCHS), lost_in=unrecorded(survivor, doomed, 2))


@pytest.mark.timeout(330)  # its waits: 300 s at most
def test_the_trainer_trains_replica_groups_as_trainloop_does(
    lighthouse_of_two: str, tmp_path: Path
) -> None:
    """The other face, no failure, a step needing both groups: every step is taken by a
    quorum of 2, both end identical, every sample trained once per epoch between them."""
    groups = [Group(g, lighthouse_of_two, tmp_path, "trainer", *BOTH, epochs=SHORT)
              for g in (0, 1)]  # fmt: skip
    for group in groups:
        group.finish(timeout=150)
    assert all(line["groups"] == 2 for g in groups for line in g.trained())
    assert [len(g.trained()) for g in groups] == [SHORT * 6] * 2  # 6 steps an epoch
    assert same_weights(*(g.weights() for g in groups))
    each_sample_once(groups, range(SHORT), lost_in={})
    for group in groups:
        steps_agree(group)


@pytest.mark.timeout(440)  # its waits: 400 s at most
def test_a_dropped_step_ends_identical_to_a_run_without_it(
    lighthouse_of_two: str, tmp_path: Path
) -> None:
    """Step 5's exchange fails on every group (an error reported before the vote): it is
    dropped everywhere, and nothing moves on, not the step, the scheduler (the Trainer steps
    one each step) nor the batches dealt. The run ends as the same run without the drop."""
    runs = {}
    for name, drop in (("dropped", ["--drop-at", "5"]), ("steady", [])):
        folder = tmp_path / name
        folder.mkdir()
        groups = [Group(g, lighthouse_of_two, folder, "trainer", *BOTH, *drop, epochs=SHORT)
                  for g in (0, 1)]  # fmt: skip
        for group in groups:
            group.finish(timeout=100)
            steps_agree(group)
        runs[name] = groups
    for group in runs["dropped"]:
        assert "step 5 was dropped on every group" in group.text(), group.text()[-3000:]
    weights = [g.weights() for run in runs.values() for g in run]
    assert same_weights(*weights)
    each_sample_once(runs["dropped"], range(SHORT), lost_in={})


@pytest.mark.timeout(470)  # its waits: 453 s at most
def test_a_short_lighthouse_outage_is_ridden_out(tmp_path: Path) -> None:
    """The lighthouse killed with -9 mid-run and started again on its port 3 s later: both
    groups go on (torchft's quorum retries) and end identical, every sample once an epoch."""
    server, address = start_lighthouse()
    groups = [Group(g, address, tmp_path, "patient") for g in (0, 1)]
    wait_until(lambda: all(sum(line["groups"] == 2 for line in g.trained()) >= 5 for g in groups),
               120, "both groups training in a quorum of 2")  # fmt: skip
    server.kill()
    server.wait()
    time.sleep(3)
    server, _ = start_lighthouse(int(address.rsplit(":", 1)[1]))
    try:
        for group in groups:
            group.finish(timeout=150)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert same_weights(*(g.weights() for g in groups))
    # A group that falls behind in the outage heals and misses a few steps of the job; the
    # samples the groups trained are still each once an epoch.
    each_sample_once(groups, range(EPOCHS), lost_in={})


@pytest.mark.timeout(90)
def test_a_lighthouse_lost_mid_run_is_named_with_torchfts_own_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchft's real give-up, no fake exception: a group that took a step, its lighthouse
    killed with -9, asks for the next quorum once with a 2 s timeout and says which
    lighthouse, keeping torchft's error as the cause."""
    import torch.distributed as dist

    from ddpkit.errors import RendezvousError
    from ddpkit.faulttolerance.manager import GroupManager

    server, address = start_lighthouse()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("RUST_LOG", "warn")  # torchft's log level, as ddpkit sets it
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # the group's store, as ddpkit run sets it
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    world = type("World", (), {"rank": 0, "world_size": 1, "device": torch.device("cpu")})()
    groups = GroupManager("0", address, world, min_groups=1, timeout=2, retries=0,
                          cap_bytes=1 << 20)  # fmt: skip
    try:
        groups.start()
        assert groups.position() == 0 and groups.manager.should_commit()
        server.kill()
        server.wait()
        groups._open = False  # the next step's quorum
        groups.start()
        with pytest.raises(RendezvousError, match=f"no quorum at the lighthouse {address} within "
                           "2 s, 0 retries included") as refused:  # fmt: skip
            groups.position()
        assert isinstance(refused.value.__cause__, TimeoutError), refused.value.__cause__
    finally:
        groups.manager.shutdown(wait=False)


# Groups of 2 run only with the kill: a kill leaves group 0 untouched and group 1 correct up
# to step 6 as well, so each case checks what its run without a kill would (20 CPU-s each).
@pytest.mark.parametrize(
    ("workers", "inside", "kill"),
    [(1, "ddp", False), (2, "ddp", True), (2, "fsdp", True), (2, "hsdp", True)],
)  # fmt: skip
def test_verify_finds_replica_groups_compute_what_one_process_computes(
    workers: int, inside: str, kill: bool
) -> None:
    """G groups of N workers against one process, the epoch's short last step (142 samples
    in batches of 8) included; DDP, FSDP or HSDP inside each group (the sharded ones
    exchange each rank's shard with the same rank of the other group). ``kill``: group 1's
    last rank kills itself with -9 after step 6; torch's agent starts the group again, it
    heals from group 0, and the run still computes what one process computes, every sample
    once (read from what each process trained, the killed one's included)."""
    command = [sys.executable, "-m", "ddpkit", "verify", "examples/fault_tolerant.py",
               "--replica-groups", "2", "--workers", str(workers), "--steps", "12",
               "--strategy", inside, *(["--kill-at", "6"] if kill else [])]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert f"PASS: 2 replica groups of {workers} worker" in done.stdout
    assert re.search(r"data +142 samples trained on, identical", done.stdout), done.stdout
    assert "2 replica groups ended with identical weights" in done.stdout
    if kill:
        said = r"killed +group 1: a process killed \(-9\) after step 6, started again " \
               r"\(restart 1 of 1\), healed at step \d+ from a live group"  # fmt: skip
        assert re.search(said, done.stdout), done.stdout
        assert "one process killed after step 6 computed what one process computes" in done.stdout


@pytest.mark.timeout(520)  # its waits: 480 s at most
def test_losing_every_group_resumes_from_the_checkpoints_not_from_step_0(tmp_path: Path) -> None:
    """Step 4 dropped on both groups, then both killed with -9 mid-run, group 1's newest
    checkpoint lost, both started again: each resumes from its last checkpoint (every 5
    steps, mid-epoch included), group 1 heals from group 0, which is ahead, ddpkit's step and
    torchft's agree throughout, and the run ends as one without the drop or the kills."""
    server, address = start_lighthouse(min_groups=2)
    face = ["resumable", *BOTH]
    try:
        for name in ("reference", "run"):
            (tmp_path / name).mkdir()
        reference = [Group(g, address, tmp_path / "reference", *face, epochs=SHORT)
                     for g in (0, 1)]  # fmt: skip
        for group in reference:
            group.finish(timeout=90)
        groups = [Group(g, address, tmp_path / "run", *face, "--drop-at", "4", epochs=SHORT)
                  for g in (0, 1)]  # fmt: skip
        wait_until(lambda: all(len(g.trained()) >= 17 for g in groups), 90, "both training")
        for group in groups:
            kill_9(group.process, workers_of(group.process.pid))
        at_kill = max(max(g.steps()) for g in groups)
        newest = sorted(Path(f"{groups[1].out}.ckpt").glob("epoch_*.pt"))[-1]
        newest.unlink()  # group 1 resumes from an older checkpoint than group 0's
        again = [Group(g, address, tmp_path / "run", *face, epochs=SHORT) for g in (0, 1)]
        for group in again:
            group.finish(timeout=90)
    finally:
        server.terminate()
        server.wait(timeout=30)
    first = again[0].steps()[0]
    assert at_kill - 6 < first <= at_kill + 1, (first, at_kill)  # group 0's own checkpoint
    assert "healed at step" in again[1].text(), again[1].text()[-3000:]
    for group in [*groups, *again]:
        steps_agree(group)
    assert same_weights(*(g.weights() for g in [*again, *reference]))
