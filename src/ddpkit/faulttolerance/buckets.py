"""**Experimental.** The exchange between replica groups in few collectives: every gradient
(and the members' slots) copied into flat buckets laid out alike on every group, one
all-reduce per bucket through torchft's Manager, all in flight together, then copied back.

One all-reduce per parameter costs torchft's per-call work (a future, its timeout, the
averaging callback) and a collective's latency each: on a 4-tensor model that was most of
what a replica-group step cost beyond a plain one (``benchmarks/ft_recovery.py``). The
layout is fixed by the tensors' order, shapes and dtypes, which every group has alike (the
same model), and not by the order backward made them in (DDP's buckets are rebuilt after the
first step from that order: a group that joins later would hold other buckets than its
peers, and their all-reduces would not match).

Example::

    buckets = Buckets(cap_bytes=25 * 2**20)
    works = buckets.start(manager, [*gradients, slots])   # all-reduces in flight
    buckets.finish(works)                                 # averaged values back in place
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

DEFAULT_CAP_MB = 25.0  # DDP's own default bucket size


class Buckets:
    """Tensors packed into flat buckets of at most ``cap_bytes`` (a larger tensor gets one
    of its own), each bucket one dtype and device; the layout made at the first exchange
    and made again only if the tensors change.

    Example:
        >>> buckets = Buckets(cap_bytes=16)
        >>> buckets.layout([torch.zeros(2), torch.zeros(2), torch.zeros(4, dtype=torch.half)])
        [[0, 1], [2]]
    """

    def __init__(self, cap_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self._key: tuple[tuple[Any, ...], ...] = ()
        self._groups: list[list[int]] = []
        self._flats: list[torch.Tensor] = []
        self._tensors: Sequence[torch.Tensor] = ()

    def layout(self, tensors: Sequence[torch.Tensor]) -> list[list[int]]:
        """The tensors' indices, bucket by bucket: in order, a new bucket where the dtype or
        the device changes or the cap would be passed."""
        groups: list[list[int]] = []
        size = 0
        for index, tensor in enumerate(tensors):
            nbytes = tensor.numel() * tensor.element_size()
            last = tensors[groups[-1][-1]] if groups else None
            alike = last is not None and (last.dtype, last.device) == (tensor.dtype, tensor.device)
            if alike and size + nbytes <= self.cap_bytes:
                groups[-1].append(index)
                size += nbytes
            else:
                groups.append([index])
                size = nbytes
        return groups

    def start(self, manager: Any, tensors: Sequence[torch.Tensor]) -> list[Any]:
        """Copy ``tensors`` into the buckets and start each bucket's all-reduce (torchft
        averages over the groups in the quorum); the works, for :meth:`finish`."""
        self._arrange(tensors)
        works = []
        for group, flat in zip(self._groups, self._flats, strict=True):
            torch.cat([tensors[i].reshape(-1) for i in group], out=flat)
            works.append(manager.allreduce(flat))
        return works

    def finish(self, works: list[Any]) -> None:
        """Wait for every bucket, then copy the averaged values back into the tensors."""
        for work in works:
            work.wait()
        for group, flat in zip(self._groups, self._flats, strict=True):
            parts = flat.split_with_sizes([self._tensors[i].numel() for i in group])
            for index, part in zip(group, parts, strict=True):
                self._tensors[index].copy_(part.view_as(self._tensors[index]))

    def _arrange(self, tensors: Sequence[torch.Tensor]) -> None:
        key = tuple((t.shape, t.dtype, t.device) for t in tensors)
        if key != self._key:
            self._key, self._groups = key, self.layout(tensors)
            self._flats = [
                torch.empty(sum(tensors[i].numel() for i in group), dtype=tensors[group[0]].dtype,
                            device=tensors[group[0]].device)
                for group in self._groups
            ]  # fmt: skip
        self._tensors = tensors
