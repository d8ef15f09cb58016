"""Memory snapshots' slots: a ring of three, each sealed by a header written last; a slot
being overwritten or damaged is never read back; DDP's replicated state shared out between a
node's rings comes back whole; the newest snapshot all ranks share is the one restored."""

from __future__ import annotations

import dataclasses
import os
import pickle
import stat
from pathlib import Path

import pytest
import torch

import ddpkit
from ddpkit._core.protocol import MEMORY_SNAPSHOTS_ENV
from ddpkit.checkpoint.memory import SLOTS, SnapshotRing, newest_common, read_snapshot
from ddpkit.errors import CheckpointError, UnsafeFolderError
from ddpkit.train.snapshots import MemorySnapshots, resume_from_memory


def state(step: int) -> dict[str, object]:
    return {"model": {"w": torch.full((4, 3), float(step)), "b": torch.arange(3)},
            "step": step, "groups": [{"lr": 0.1 * step}]}  # fmt: skip


def test_the_ring_keeps_the_last_three_and_reads_them_back(tmp_path: Path) -> None:
    ring = SnapshotRing(tmp_path, "rank0")
    for step in range(1, 6):
        ring.write(f"s{step}", step, state(step), {"rng": torch.tensor([step])})
    assert ring.whole() == {"s3": 3, "s4": 4, "s5": 5}
    shared, own = read_snapshot([ring], "s4")
    assert torch.equal(shared["model"]["w"], torch.full((4, 3), 4.0)) and shared["step"] == 4
    assert shared["groups"] == [{"lr": 0.1 * 4}] and own["rng"].tolist() == [4]
    assert len(list(tmp_path.iterdir())) == 2 * SLOTS  # a data file and a header a slot


def test_a_slot_being_written_is_not_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ring = SnapshotRing(tmp_path, "rank0")
    for step in range(1, 4):
        ring.write(f"s{step}", step, state(step), {})

    def killed(*_args: object) -> None:
        raise KeyboardInterrupt  # the process dies in the middle of the copy

    monkeypatch.setattr("ddpkit.checkpoint.memory.copy_all", killed)
    with pytest.raises(KeyboardInterrupt):
        ring.write("s4", 4, state(4), {})
    assert ring.whole() == {"s2": 2, "s3": 3}  # s1's slot lost its header before its data


def test_damaged_data_is_refused_by_its_checksum(tmp_path: Path) -> None:
    ring = SnapshotRing(tmp_path, "rank0")
    ring.write("s1", 1, state(1), {})
    data = tmp_path / "rank0.0.data"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="memory snapshot s1 of rank0 is damaged"):
        read_snapshot([ring], "s1")


def test_replicated_state_shared_out_between_a_nodes_rings(tmp_path: Path) -> None:
    rings = [SnapshotRing(tmp_path, f"rank{r}", writers=2, share=r) for r in range(2)]
    for r, ring in enumerate(rings):
        ring.write("s7", 7, state(7), {"rank": torch.tensor([r])})
    sizes = [(tmp_path / f"rank{r}.0.data").stat().st_size for r in range(2)]
    assert all(0 < size < 4 * 3 * 4 + 3 * 8 + 2 * 64 for size in sizes)  # each holds a part
    shared, own = read_snapshot([rings[1], rings[0]], "s7")
    assert torch.equal(shared["model"]["w"], torch.full((4, 3), 7.0))
    assert torch.equal(shared["model"]["b"], torch.arange(3)) and own["rank"].tolist() == [1]
    with pytest.raises(CheckpointError, match="a node's ring is missing"):
        read_snapshot([rings[1]], "s7")  # the other rank's part is not there


def test_the_newest_snapshot_every_rank_holds() -> None:
    # rank 1 was killed copying step 6 (its slot unsealed): rank 0 went one step further
    assert newest_common([{"s5": 5, "s6": 6, "s7": 7}, {"s4": 4, "s5": 5}]) == "s5"
    assert newest_common([{"s5": 5}, {"s6": 6}]) is None


def test_a_memory_folder_others_can_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shm"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777 | stat.S_ISVTX)
    monkeypatch.setenv(MEMORY_SNAPSHOTS_ENV, str(shared))
    with pytest.raises(UnsafeFolderError, match="writable by its group and everyone"):
        MemorySnapshots.from_environment(sharded=False)
    monkeypatch.delenv(MEMORY_SNAPSHOTS_ENV)
    assert MemorySnapshots.from_environment(sharded=False) is None  # off without a folder


def test_a_first_attempt_resumes_nothing_from_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.chmod(tmp_path, 0o700)
    monkeypatch.setenv(MEMORY_SNAPSHOTS_ENV, str(tmp_path))
    ddpkit.init(hang_timeout=0)
    try:
        snapshots = MemorySnapshots.from_environment(sharded=False)
        assert snapshots is not None
        snapshots.take({"epoch": 0, "step": 1, "model": {"w": torch.ones(2)}}, None, None)
        assert snapshots.ring.whole() == {"1:0:end": 0}
        assert resume_from_memory(snapshots, loop=None) is None  # type: ignore[arg-type]
    finally:
        ddpkit.shutdown()


def test_a_run_resumed_from_elsewhere_never_goes_back_to_what_memory_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An elastic job at 8 ranks keeps steps 1-4, loses a node and resumes at 7 from its
    checkpoint (the snapshots were taken at another world size), trains on, then grows back
    to 8: the snapshots of the 8-rank past must be gone by then, or that restart finds them
    whole and common and goes back to step 4 (seen in the scale tier: "resumed from memory
    at step 4: 4 completed step(s) lost", a step-8 checkpoint on disk)."""
    os.chmod(tmp_path, 0o700)
    monkeypatch.setenv(MEMORY_SNAPSHOTS_ENV, str(tmp_path))
    world = ddpkit.init(hang_timeout=0)
    restarted = dataclasses.replace(world, restart=1)  # torch's agent started it again
    monkeypatch.setattr("ddpkit.train.snapshots.current_world", lambda: restarted)
    try:
        past = MemorySnapshots(tmp_path, fit=1)
        past.world = dataclasses.replace(world, world_size=8)  # the job's size back then
        for step in range(1, 5):
            past.take({"epoch": 0, "step": step, "model": {"w": torch.ones(2)}}, None, None)
        now = MemorySnapshots(tmp_path, fit=1)  # the restarted worker, at another size
        assert resume_from_memory(now, loop=None) is None  # type: ignore[arg-type]
        for step in (5, 6):  # trained on from the checkpoint
            now.take({"epoch": 0, "step": step, "model": {"w": torch.ones(2)}}, None, None)
        assert now.ring.whole() == {"5:0:end": 0, "6:0:end": 1}  # before: 3 and 4 were kept
    finally:
        ddpkit.shutdown()


def test_a_header_that_holds_code_is_refused_unrun(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ring = SnapshotRing(tmp_path, "rank0")
    ring.write("s1", 1, state(1), {})
    planted = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {planted}",))

    (tmp_path / "rank0.0.head").write_bytes(pickle.dumps({"key": Payload()}))
    assert ring.whole() == {}  # passed over, said: every rank still answers the gather
    assert "unreadable: posix.system is not a plain value" in caplog.text
    assert not planted.exists()


def test_own_tensors_of_any_shape_travel_in_the_header(tmp_path: Path) -> None:
    ring = SnapshotRing(tmp_path, "rank0")
    own = {"count": torch.tensor(3.5), "rows": torch.arange(6).view(2, 3), "none": torch.zeros(0)}
    ring.write("s1", 1, {}, own)
    _, back = read_snapshot([ring], "s1")
    assert all(torch.equal(back[name], own[name]) for name in own)


def test_a_sealed_slot_copied_as_it_lies_reads_back_in_the_other_nodes_ring(
    tmp_path: Path,
) -> None:
    """What a copy to the next node does, without the network: the slot's header and data
    taken as they lie, received into another ring and sealed there; read back whole, and a
    byte changed on the way is refused by the sum."""
    (mine := tmp_path / "node0").mkdir()
    (theirs := tmp_path / "node1").mkdir()
    ring, kept = SnapshotRing(mine, "fit1.rank2"), SnapshotRing(theirs, "fit1.kept2")
    for step in (1, 2):
        ring.write(f"s{step}", step, state(step), {"rng": torch.tensor([step])})
        assert ring.last is not None
        sealed = ring.sealed(ring.last)
        assert sealed is not None
        header, data = sealed
        slot, into = kept.receive(data.numel())
        assert kept.whole().get(f"s{step}") is None  # not whole before its header
        into.copy_(data)
        kept.accept(slot, header)
    assert kept.whole() == {"s1": 1, "s2": 2}
    shared, own = read_snapshot([kept], "s2")
    assert torch.equal(shared["model"]["w"], torch.full((4, 3), 2.0)) and own["rng"].tolist() == [2]
    damaged = SnapshotRing(theirs, "fit1.kept3")
    slot, into = damaged.receive(data.numel())
    into.copy_(data)
    into[0] ^= 1  # a byte changed on the way
    damaged.accept(slot, header)
    with pytest.raises(CheckpointError, match="damaged"):
        read_snapshot([damaged], "s2")


def test_a_slot_being_copied_away_is_not_overwritten(tmp_path: Path) -> None:
    ring = SnapshotRing(tmp_path, "rank0")
    ring.write("s1", 1, state(1), {})
    ring.pinned = ring.last  # its copy to the next node is in flight
    for step in range(2, 6):
        ring.write(f"s{step}", step, state(step), {})
    assert "s1" in ring.whole()  # the two other slots took every later snapshot
    assert ring.whole() == {"s1": 1, "s4": 4, "s5": 5}
