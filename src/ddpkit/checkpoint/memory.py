"""A rank's training state kept in the node's memory after every step, so that a restarted
worker goes on from the last step without reading storage.

``ddpkit run`` makes a private folder for the job in ``/dev/shm`` (memory, not disk), which
outlives its workers and is removed when the launch ends; the next launch sweeps the folder
of a launcher that was killed. In it each rank keeps a :class:`SnapshotRing` of three slots.
A slot is a data file that the state's tensors are copied into at their offsets (one copy a
tensor, nothing serialised) and a small header, written last and renamed into place, that
names the snapshot, the tensors' places and the data's CRC-32. A slot's header is removed
before its data is overwritten, so a worker killed during a copy leaves its other two whole.

Three slots, not two: a rank can finish the step after the one another rank was killed
copying (the all-reduce of that later step needs every rank, the one after it does not come),
and the two must still share a whole snapshot: :func:`newest_common` picks it.

Where replicas are identical (DDP), the state's tensors are shared out between a node's
ranks: each copies every ``writers``-th one, so a node holds one copy and each rank pays its
part; a restore reads the node's rings together.

Example:
    >>> import tempfile, torch
    >>> ring = SnapshotRing(Path(tempfile.mkdtemp()), "rank0")
    >>> ring.write("s7", 7, {"w": torch.arange(3.0), "step": 7}, {})
    >>> ring.whole()
    {'s7': 7}
    >>> state, own = read_snapshot([ring], "s7")
    >>> state["w"], state["step"]
    (tensor([0., 1., 2.]), 7)
"""

from __future__ import annotations

import contextlib
import mmap
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ddpkit.errors import CheckpointError
from ddpkit.runtime.tensortree import map_tensors

SLOTS = 3
_ALIGN = 64  # each tensor's offset: aligned for any dtype's view
_MARK = "ddpkit.memory.tensor"  # a tensor's place in the saved skeleton: (_MARK, space, index)
SHARED, OWN = "shared", "own"


@dataclass(frozen=True)
class Place:
    """Where one tensor sits in a slot's data file."""

    space: str  # SHARED (the replicated run state) or OWN (this rank's)
    index: int
    offset: int
    dtype: str
    shape: tuple[int, ...]


class SnapshotRing:
    """One rank's three slots in ``folder``, files named after ``owner``.

    ``writers`` and ``share``: of the shared state's tensors this ring copies those whose
    index is ``share`` modulo ``writers`` (1 and 0: all of them).

    Example::

        ring = SnapshotRing(Path(os.environ["DDPKIT_MEMORY_SNAPSHOTS"]), "fit1.rank0")
    """

    def __init__(self, folder: Path, owner: str, writers: int = 1, share: int = 0) -> None:
        self.folder, self.owner = folder, owner
        self.writers, self.share = writers, share
        self._written = 0  # snapshots written by this process: the next slot
        self._maps: dict[int, tuple[mmap.mmap, torch.Tensor]] = {}

    def write(self, key: str, order: int, shared: Any, own: Any) -> None:
        """Keep ``shared`` and ``own`` as snapshot ``key`` (``order``: later ones more),
        in the slot written longest ago; sealed when this returns."""
        slot = self._written % SLOTS
        self._written += 1
        head = self._path(slot, "head")
        with contextlib.suppress(FileNotFoundError):
            head.unlink()  # unsealed before a byte of its data changes
        tensors: list[tuple[str, int, torch.Tensor]] = []
        skeletons = (_skeleton(shared, SHARED, tensors), _skeleton(own, OWN, tensors))
        mine = [t for t in tensors if t[0] == OWN or t[1] % self.writers == self.share]
        places, size = _layout(mine)
        data = self._data(slot, size)
        for place, (_space, _index, tensor) in zip(places, mine, strict=True):
            view = data[place.offset : place.offset + tensor.nelement() * tensor.element_size()]
            view.view(tensor.dtype).view(tensor.shape).copy_(tensor)
        crc = zlib.crc32(memoryview(self._maps[slot][0])[:size])
        header = {"key": key, "order": order, "skeletons": skeletons, "crc": crc, "size": size,
                  "places": [vars(p) | {"shape": list(p.shape)} for p in places]}  # fmt: skip
        making = head.with_suffix(".making")
        torch.save(header, making)
        os.replace(making, head)  # sealed

    def whole(self) -> dict[str, int]:
        """The sealed snapshots: their keys and orders (the data is checked when read)."""
        found = {}
        for slot in range(SLOTS):
            header = self._header(slot)
            if header is not None:
                found[str(header["key"])] = int(header["order"])
        return found

    def read(self, key: str) -> tuple[dict[str, Any], dict[tuple[str, int], torch.Tensor]]:
        """Snapshot ``key``'s header and the tensors this ring holds of it, copied out."""
        for slot in range(SLOTS):
            header = self._header(slot)
            if header is None or header["key"] != key:
                continue
            with open(self._path(slot, "data"), "rb") as file:
                data = file.read(int(header["size"]))
            if len(data) != header["size"] or zlib.crc32(data) != header["crc"]:
                raise CheckpointError(f"memory snapshot {key} of {self.owner} is damaged")
            raw = (
                torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else None
            )  # copied out
            return header, {
                (p["space"], p["index"]): _tensor_at(raw, Place(**p)) for p in header["places"]
            }
        raise CheckpointError(f"memory snapshot {key} of {self.owner} is gone")

    def _header(self, slot: int) -> dict[str, Any] | None:
        try:
            header: dict[str, Any] = torch.load(self._path(slot, "head"), weights_only=True)
        except (OSError, RuntimeError, EOFError):  # none, or a header cut short
            return None
        return header

    def _data(self, slot: int, size: int) -> torch.Tensor:
        """The slot's data file mapped, ``size`` bytes at least (grown when the state grew)."""
        mapped = self._maps.get(slot)
        if mapped is not None and len(mapped[0]) >= max(size, 1):
            return mapped[1]
        path = self._path(slot, "data")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, max(size, 1))
            region = mmap.mmap(fd, max(size, 1))
        finally:
            os.close(fd)
        view = torch.frombuffer(region, dtype=torch.uint8)
        self._maps[slot] = (region, view)
        return view

    def _path(self, slot: int, kind: str) -> Path:
        return self.folder / f"{self.owner}.{slot}.{kind}"


def read_snapshot(rings: list[SnapshotRing], key: str) -> tuple[Any, Any]:
    """Snapshot ``key`` put together from ``rings`` (this rank's first, then the node's
    others that share the state with it): the shared state and this rank's own.

    Example::

        shared, own = read_snapshot([mine, *neighbours], "e0-s57")
    """
    header, tensors = rings[0].read(key)
    for ring in rings[1:]:
        _, theirs = ring.read(key)
        tensors.update({k: v for k, v in theirs.items() if k[0] == SHARED})
    shared, own = header["skeletons"]

    def put_back(value: Any) -> Any:
        if isinstance(value, tuple) and len(value) == 3 and value[0] == _MARK:
            found = tensors.get((value[1], value[2]))
            if found is None:
                raise CheckpointError(f"memory snapshot {key} lacks a tensor ({value[1]} "
                                      f"#{value[2]}): a node's ring is missing")  # fmt: skip
            return found
        if isinstance(value, dict):
            return type(value)((k, put_back(v)) for k, v in value.items())
        if isinstance(value, list | tuple):
            return type(value)(put_back(v) for v in value)
        return value

    return put_back(shared), put_back(own)


def newest_common(whole_by_rank: list[dict[str, int]]) -> str | None:
    """The newest snapshot every rank holds whole (None: none).

    Example:
        >>> newest_common([{"s5": 5, "s6": 6}, {"s4": 4, "s5": 5, "s6": 6}, {"s5": 5}])
        's5'
    """
    if not whole_by_rank:
        return None
    common = set(whole_by_rank[0]).intersection(*whole_by_rank[1:])
    return max(common, key=lambda key: whole_by_rank[0][key], default=None)


def _skeleton(state: Any, space: str, tensors: list[tuple[str, int, torch.Tensor]]) -> Any:
    """``state`` with each tensor replaced by its mark, the tensor listed in ``tensors``."""

    first = len(tensors)

    def mark(tensor: torch.Tensor) -> tuple[str, str, int]:
        index = len(tensors) - first  # each space is walked in one go
        tensors.append((space, index, tensor.detach()))
        return (_MARK, space, index)

    return map_tensors(state, mark)


def _layout(tensors: list[tuple[str, int, torch.Tensor]]) -> tuple[list[Place], int]:
    """Each tensor's place, aligned, and the bytes they take."""
    places, offset = [], 0
    for space, index, tensor in tensors:
        places.append(Place(space, index, offset, str(tensor.dtype), tuple(tensor.shape)))
        size = tensor.nelement() * tensor.element_size()
        offset += -(-size // _ALIGN) * _ALIGN
    return places, offset


def _tensor_at(raw: torch.Tensor | None, place: Place) -> torch.Tensor:
    dtype = getattr(torch, place.dtype.removeprefix("torch."))
    count = 1
    for dim in place.shape:
        count *= dim
    if raw is None or count == 0:
        return torch.empty(place.shape, dtype=dtype)
    size = count * torch.empty((), dtype=dtype).element_size()
    # a tensor of its own: some of torch's readers (a generator's set_state) take the
    # storage's start, not a view's
    return raw[place.offset : place.offset + size].view(dtype).view(place.shape).clone()
