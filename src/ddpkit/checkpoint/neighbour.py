"""Each node's memory snapshots copied to the next node's memory, in the background, so that
a lost node's ranks resume from their neighbour's copy (Gemini, SOSP 2023: checkpoints kept
in the CPU memory of the local and of peer machines).

Rank r sends each new sealed slot of its ring (:class:`~ddpkit.checkpoint.memory.SnapshotRing`)
to rank (r + L) mod W, the same local rank on the next node (L ranks a node, W in all), over
a gloo group of the copies' own, and keeps rank (r - L) mod W's copies in a ring of the
node's folder. A thread on each side sends and receives (gloo's point-to-point works say they
are done only when waited on): a step only hands the sender its newest slot, and only when
the last copy is through. At most one copy is in flight; the slot being sent is not
overwritten meanwhile (the ring skips it); a step that finds the sender busy is passed over
and counted (said once), and the newest snapshot goes as soon as the copy in flight is
through (a job that stops or pauses has its last step copied). A copy travels as three
messages: its sizes, its data straight into the kept ring's mapped slot, its header; the
header is renamed into place last, as a local write's is, and its sum is checked when the
snapshot is read.

When a node is lost and a replacement joins at the same world size, the replacement's ranks
hold nothing of their own: :func:`fetch_from_neighbours` has each holder send the agreed
snapshot's slot to the rank it belongs to, and the usual restore follows.

Example::

    copies = NeighbourCopies(ring, kept, group, world)   # then copies.offer() after each write
"""

from __future__ import annotations

import contextlib
import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ddpkit._core.log import logger
from ddpkit._core.text import first_line
from ddpkit.checkpoint.memory import SnapshotRing
from ddpkit.env.world import World

_COPY, _FETCH = 1, 2  # the messages' tags: the background copies, a restart's fetches
_END = -1  # sizes that say "no more copies" (the sender is closing)
_PATIENCE = timedelta(days=7)  # a receiver waits for the next copy as long as the job runs


def partners(world: World) -> tuple[int, int]:
    """(the rank this one's copies go to, the rank whose copies this one keeps).

    Example:
        >>> partners(World(rank=1, local_rank=1, world_size=4, local_world_size=2))
        (3, 3)
    """
    step = world.local_world_size
    return (world.rank + step) % world.world_size, (world.rank - step) % world.world_size


def copies_group() -> Any:
    """A gloo group of every rank for the copies (their traffic never queues behind the
    training's collectives, and they run on NCCL jobs too: snapshots live in host memory).
    A collective: every rank calls it.

    Example::

        group = copies_group()
    """
    return dist.new_group(backend="gloo", timeout=_PATIENCE)


class NeighbourCopies:
    """This rank's side of the copies: ``ring``'s slots sent on, the previous node's same
    local rank's kept in ``kept``.

    Example::

        copies = NeighbourCopies(ring, SnapshotRing(folder, "fit1.kept0"), group, world)
    """

    def __init__(self, ring: SnapshotRing, kept: SnapshotRing, group: Any, world: World) -> None:
        self.ring, self.kept, self.group = ring, kept, group
        self.to, self.source = partners(world)
        self.passed_over = 0  # steps whose snapshot found the previous copy still in flight
        self._slot: int | None = None  # handed to the sender
        self._newer = False  # a snapshot written while a copy was in flight
        self._wake = threading.Condition()
        self._closing = False
        self._sender = threading.Thread(target=self._send_all, name="ddpkit-copy-send",
                                        daemon=True)  # fmt: skip
        self._receiver = threading.Thread(target=self._receive_all, name="ddpkit-copy-receive",
                                          daemon=True)  # fmt: skip
        self._sender.start()
        self._receiver.start()

    def offer(self) -> None:
        """After a write: the ring's newest slot to the next node, unless a copy is in
        flight (then this step is passed over and counted)."""
        with self._wake:
            if self.ring.pinned is not None:
                self._newer = True  # sent when the copy in flight is through
                self.passed_over += 1
                if self.passed_over == 1:  # rank 0's says it for all (they go alike)
                    logger.info(f"memory snapshots: the copies to the next node fall behind "
                                f"the steps (rank {self.to}'s here); the newest goes when the "
                                "one in flight is through")  # fmt: skip
                return
            self.ring.pinned = self._slot = self.ring.last
            self._wake.notify()

    def close(self) -> None:
        """No more copies: the last one finished, the end said to the next node, and the
        previous node's end waited for (a few seconds at most: a lost peer says none)."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._sender.join(timeout=30)
        self._receiver.join(timeout=10)

    def _send_all(self) -> None:
        while True:
            with self._wake:
                while self._slot is None and not self._closing:
                    self._wake.wait()
                slot, closing = self._slot, self._closing
            if slot is None and closing:
                self._send_sizes(_END, _END)
                return
            assert slot is not None
            try:
                self._send(slot)
            except RuntimeError as err:  # the next node is gone: a restart is coming
                logger.info(f"memory snapshots: the copies to rank {self.to} stopped: "
                            f"{first_line(err)}")  # fmt: skip
                return
            finally:
                with self._wake:  # the newest snapshot next, if one came meanwhile
                    newer, self._newer = self._newer, False
                    self._slot = self.ring.pinned = self.ring.last if newer else None

    def _send(self, slot: int) -> None:
        sealed = self.ring.sealed(slot)
        if sealed is None:
            return
        header, data = sealed
        self._send_sizes(data.numel(), len(header))
        if data.numel():
            dist.send(data, self.to, group=self.group, tag=_COPY)
        dist.send(torch.frombuffer(bytearray(header), dtype=torch.uint8), self.to,
                  group=self.group, tag=_COPY)  # fmt: skip

    def _send_sizes(self, data: int, header: int) -> None:
        with contextlib.suppress(RuntimeError):  # at close, a peer may be gone already
            sizes = torch.tensor([data, header], dtype=torch.int64)
            dist.send(sizes, self.to, group=self.group, tag=_COPY)

    def _receive_all(self) -> None:
        try:
            while self._receive_one():
                pass
        except RuntimeError as err:  # the previous node is gone: a restart is coming
            logger.info(f"memory snapshots: the copies from rank {self.source} stopped: "
                        f"{first_line(err)}")  # fmt: skip

    def _receive_one(self) -> bool:
        sizes = torch.zeros(2, dtype=torch.int64)
        dist.recv(sizes, self.source, group=self.group, tag=_COPY)
        data_size, header_size = (int(v) for v in sizes)
        if data_size == _END:
            return False
        slot, data = self.kept.receive(data_size)
        if data_size:
            dist.recv(data, self.source, group=self.group, tag=_COPY)
        header = torch.empty(header_size, dtype=torch.uint8)
        dist.recv(header, self.source, group=self.group, tag=_COPY)
        self.kept.accept(slot, header.numpy().tobytes())
        return True


def fetch_from_neighbours(
    key: str, ring: SnapshotRing, kept: SnapshotRing, needy: list[int], group: Any, world: World
) -> None:
    """Snapshot ``key`` sent by each holder to the ranks in ``needy`` (which hold none of
    their own), into their rings; every rank calls it (those with nothing to do return).

    Example::

        fetch_from_neighbours("57:3:step", ring, kept, [2, 3], group, world)
    """
    to, source = partners(world)
    works = []
    if source in needy:  # this rank keeps the copies of one that lost its own: send it
        slot = kept.slot_of(key)
        sealed = kept.sealed(slot) if slot is not None else None
        if sealed is None:
            raise RuntimeError(f"rank {world.rank} lost its copy of rank {source}'s {key}")
        header, data = sealed
        sizes = torch.tensor([data.numel(), len(header)], dtype=torch.int64)
        header_tensor = torch.frombuffer(bytearray(header), dtype=torch.uint8)
        works += [dist.isend(t, source, group=group, tag=_FETCH)
                  for t in (sizes, data, header_tensor) if t.numel()]  # fmt: skip
    if world.rank in needy:
        sizes = torch.zeros(2, dtype=torch.int64)
        dist.recv(sizes, to, group=group, tag=_FETCH)
        slot, data = ring.receive(int(sizes[0]))
        if data.numel():
            dist.recv(data, to, group=group, tag=_FETCH)
        header_tensor = torch.empty(int(sizes[1]), dtype=torch.uint8)
        dist.recv(header_tensor, to, group=group, tag=_FETCH)
        ring.accept(slot, header_tensor.numpy().tobytes())
    for work in works:
        if work is not None:
            work.wait()
