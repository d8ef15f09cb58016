"""A rank's training state kept in the node's memory after every step, so that a restarted
worker goes on from the last step without reading storage.

``ddpkit run`` makes a private folder for the job in ``/dev/shm`` (memory, not disk), which
outlives its workers and is removed when the launch ends; the next launch sweeps the folder
of a launcher that was killed. In it each rank keeps a :class:`SnapshotRing` of three slots.
A slot is a data file that the state's tensors are copied into at their offsets (one copy a
tensor, nothing serialised) and a small header, written last and renamed into place, that
names the snapshot, the tensors' places and a 64-bit sum of the data (a slot changed after
it was sealed is refused). A slot's header is removed before its data is overwritten, and
renamed into place only after the copy: a worker killed during a copy leaves its other two
whole. The header is a pickle of plain values, read back by an unpickler that resolves no
class but ``OrderedDict``: no code can come out of it (``torch.save`` of the same header cost
2.5 ms a step; this costs a tenth).

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

import collections
import contextlib
import io
import mmap
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ddpkit._compat.foreach import copy_all
from ddpkit._core.log import EVERY_RANK, logger
from ddpkit.errors import CheckpointError
from ddpkit.runtime.tensortree import map_tensors

SLOTS = 3
_ALIGN = 64  # each tensor's offset: aligned for any dtype's view
_MARK = "ddpkit.memory.tensor"  # a tensor's place in the saved skeleton: (_MARK, space, index)
SHARED, OWN = "shared", "own"


@dataclass(frozen=True)
class Place:
    """Where one tensor sits in a slot's data file.

    Example::

        Place(SHARED, 0, 0, "torch.float32", (32, 6))   # the first shared tensor, at 0
    """

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

        ring = SnapshotRing(Path(folder), "fit1.rank0")   # the job's folder in /dev/shm
    """

    def __init__(self, folder: Path, owner: str, writers: int = 1, share: int = 0) -> None:
        self.folder, self.owner = folder, owner
        self.writers, self.share = writers, share
        self._orders: dict[int, int] = {}  # each slot's snapshot, by order (-1: none)
        self._maps: dict[int, tuple[mmap.mmap, torch.Tensor]] = {}
        self._views: dict[int, tuple[Any, list[tuple[Any, ...]], int, list[torch.Tensor]]] = {}
        self._paths: dict[tuple[int, str], str] = {}
        self.pinned: int | None = None  # a slot being copied away: not overwritten meanwhile
        self.last: int | None = None  # the slot written last

    def write(self, key: str, order: int, shared: Any, own: Any) -> None:
        """Keep ``shared`` and ``own`` as snapshot ``key`` (``order``: later ones more),
        in the slot written longest ago; sealed when this returns."""
        slot = self._oldest_slot()
        self._orders[slot] = order
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(slot, "head"))  # unsealed before a byte of its data changes
        tensors: list[tuple[str, int, torch.Tensor]] = []
        skeletons = (_skeleton(shared, SHARED, tensors), _skeleton(own, OWN, tensors))
        mine = [t for t in tensors if t[0] == SHARED and t[1] % self.writers == self.share]
        small = [_inline(t) for space, _index, t in tensors if space == OWN]  # random states...
        places, size, views = self._places(slot, mine)  # as plain values, for the header
        copy_all(views, [tensor for _space, _index, tensor in mine])
        data = self._maps[slot][1]
        header = {"key": key, "order": order, "skeletons": skeletons, "sum": _sum64(data[:size]),
                  "size": size, "places": places,
                  "own": small}  # fmt: skip
        self._seal(slot, pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL))

    def _seal(self, slot: int, header: bytes) -> None:
        """The slot's header written aside and renamed into place: the slot is whole."""
        making = self._path(slot, "making")
        # os-level calls, not pathlib's: a snapshot is sealed every step
        fd = os.open(making, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            written = 0
            while written < len(header):
                written += os.write(fd, memoryview(header)[written:])
        finally:
            os.close(fd)
        os.replace(making, self._path(slot, "head"))  # sealed
        self.last = slot

    def _oldest_slot(self) -> int:
        """The slot to write next: one never written, else the one of the oldest snapshot
        (after a restart: not the one just resumed from), never one being copied away."""
        if not self._orders:
            for slot in range(SLOTS):
                with contextlib.suppress(CheckpointError):
                    header = self._header(slot)
                    self._orders[slot] = int(header["order"]) if header is not None else -1
        free = [slot for slot in range(SLOTS) if slot != self.pinned]
        return min(free, key=lambda slot: self._orders.get(slot, -1))

    def sealed(self, slot: int) -> tuple[bytes, torch.Tensor] | None:
        """Slot ``slot`` as it lies: its header's bytes and a view of its data (None: not
        sealed). What a copy to another node sends.

        Example::

            header, data = ring.sealed(ring.last)
        """
        try:
            raw = Path(self._path(slot, "head")).read_bytes()
        except OSError:
            return None
        header = _PlainUnpickler(io.BytesIO(raw)).load()
        return raw, self._data(slot, int(header["size"]))[: int(header["size"])]

    def slot_of(self, key: str) -> int | None:
        """The slot that holds snapshot ``key`` (None: none does)."""
        for slot in range(SLOTS):
            with contextlib.suppress(CheckpointError):
                header = self._header(slot)
                if header is not None and header["key"] == key:
                    return slot
        return None

    def receive(self, size: int) -> tuple[int, torch.Tensor]:
        """A slot to take a copy from elsewhere: the oldest, unsealed, and a view of
        ``size`` bytes of its data to receive into; :meth:`accept` seals it.

        Example::

            slot, data = kept.receive(size)   # then fill data, then kept.accept(slot, header)
        """
        slot = self._oldest_slot()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(slot, "head"))  # unsealed before a byte of its data changes
        self._orders[slot] = 1 + max(self._orders.values(), default=-1)
        return slot, self._data(slot, size)[:size]

    def accept(self, slot: int, header: bytes) -> None:
        """Seal a slot :meth:`receive` gave, with the header that came with its data (its sum
        is checked when the snapshot is read, as a local one's)."""
        order = int(_PlainUnpickler(io.BytesIO(header)).load()["order"])
        self._orders[slot] = order
        self._seal(slot, header)

    def _places(
        self, slot: int, tensors: list[tuple[str, int, torch.Tensor]]
    ) -> tuple[list[tuple[Any, ...]], int, list[torch.Tensor]]:
        """Where ``tensors`` go in the slot's data, and a view of each place: made again
        only when the tensors' shapes change (a step's are the last step's)."""
        shapes = [(t.dtype, t.shape) for _space, _index, t in tensors]
        kept = self._views.get(slot)
        if kept is not None and kept[0] == shapes:
            return kept[1], kept[2], kept[3]
        found, size = _layout(tensors)
        data = self._data(slot, size)
        views = [_view_at(data, p, t) for p, (_s, _i, t) in zip(found, tensors, strict=True)]
        places = [tuple(vars(place).values()) for place in found]
        self._views[slot] = (shapes, places, size, views)
        return places, size, views

    def forget(self) -> None:
        """Unseal every slot: what they hold is never read back (their data files stay, to
        be written over). For a run that goes on from elsewhere than this ring.

        Example::

            ring.forget()   # ring.whole() == {}
        """
        for slot in range(SLOTS):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(slot, "head"))
            self._orders[slot] = -1

    def whole(self) -> dict[str, int]:
        """The sealed snapshots: their keys and orders (the data is checked when read). An
        unreadable header is said and passed over: every rank must answer (a collective
        gathers the answers), and a slot that cannot be read is not whole."""
        found = {}
        for slot in range(SLOTS):
            try:
                header = self._header(slot)
            except CheckpointError as err:
                logger.warning(f"warning: {err}; that slot is passed over", extra=EVERY_RANK)
                continue
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
            raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else None
            if len(data) != header["size"] or (raw is not None and _sum64(raw) != header["sum"]):
                raise CheckpointError(f"memory snapshot {key} of {self.owner} is damaged")
            places = [Place(*fields) for fields in header["places"]]
            found = {(p.space, p.index): _tensor_at(raw, p) for p in places}
            found.update({(OWN, i): _from_inline(*small) for i, small in enumerate(header["own"])})
            return header, found
        raise CheckpointError(f"memory snapshot {key} of {self.owner} is gone")

    def _header(self, slot: int) -> dict[str, Any] | None:
        try:
            raw = Path(self._path(slot, "head")).read_bytes()
        except OSError:  # none: a slot never written, or being written
            return None
        try:
            header: dict[str, Any] = _PlainUnpickler(io.BytesIO(raw)).load()
        except (pickle.UnpicklingError, EOFError, ValueError) as err:
            raise CheckpointError(
                f"memory snapshot header of {self.owner} is unreadable: {err}"
            ) from None
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

    def _path(self, slot: int, kind: str) -> str:
        path = self._paths.get((slot, kind))
        if path is None:  # made once: the same few names every step
            path = self._paths[(slot, kind)] = str(self.folder / f"{self.owner}.{slot}.{kind}")
        return path


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
        tensors.append((space, index, tensor))  # copied without autograd: no detach (1 us each)
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


class _PlainUnpickler(pickle.Unpickler):
    """Plain values only: every class but ``OrderedDict`` (a state dict) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"{module}.{name} is not a plain value")


def _inline(tensor: torch.Tensor) -> tuple[str, list[int], bytes]:
    """A small tensor as plain values, for the header: its own state changes shape from
    step to step (metric rows not yet folded), which a place in the data file cannot."""
    here = tensor.detach().cpu().contiguous()
    return str(here.dtype), list(here.shape), here.reshape(-1).view(torch.uint8).numpy().tobytes()


def _from_inline(dtype: str, shape: list[int], raw: bytes) -> torch.Tensor:
    kind = getattr(torch, dtype.removeprefix("torch."))
    if not raw:
        return torch.empty(shape, dtype=kind)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(kind).reshape(shape).clone()


def _view_at(data: torch.Tensor, place: Place, tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``place`` in ``data``, seen as a tensor shaped as ``tensor``."""
    size = tensor.nelement() * tensor.element_size()
    return data[place.offset : place.offset + size].view(tensor.dtype).view(tensor.shape)


def _sum64(data: torch.Tensor) -> int:
    """The data's 8-byte words summed (wrapping): a slot changed after its seal is refused.
    Sizes are multiples of 64 bytes (every tensor's place is aligned)."""
    return int(data.view(torch.int64).sum()) if data.numel() else 0


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
