"""The exchange between replica groups in few all-reduces: the gradients packed into buckets
laid out alike on every group, averaged, and copied back into place."""

from __future__ import annotations

from typing import Any

import torch

from ddpkit.faulttolerance.buckets import Buckets


class TwoGroups:
    """torchft's AVG all-reduce between this group and another, whose buckets are given;
    counts the all-reduces."""

    def __init__(self, theirs: list[torch.Tensor]) -> None:
        self.theirs, self.calls = theirs, 0

    def allreduce(self, flat: torch.Tensor) -> Any:
        flat.add_(self.theirs[self.calls]).div_(2)
        self.calls += 1
        return type("Done", (), {"wait": lambda self: True})()


def packed(buckets: Buckets, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """What ``tensors`` look like packed by ``buckets``'s layout (the other group's side)."""
    return [torch.cat([tensors[i].reshape(-1) for i in group]) for group in
            buckets.layout(tensors)]  # fmt: skip


def test_every_tensor_is_averaged_in_place_with_one_all_reduce_per_bucket() -> None:
    torch.manual_seed(0)
    mine = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2).half(), torch.randn(7)]
    theirs = [torch.randn_like(t) for t in mine]
    expected = [(a.float() + b.float()).div(2).to(a.dtype)
                for a, b in zip(mine, theirs, strict=True)]  # fmt: skip
    buckets = Buckets(cap_bytes=17 * 4)  # 12 + 5 floats fit; the halves and the 7 apart
    manager = TwoGroups(packed(buckets, theirs))
    kept = [t.data_ptr() for t in mine]
    buckets.finish(buckets.start(manager, mine))
    assert manager.calls == 3  # [3x4, 5], [2x2 half], [7]: not one per tensor
    for got, want in zip(mine, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    assert [t.data_ptr() for t in mine] == kept  # the gradients themselves, not copies


def test_the_layout_is_the_same_on_every_group_and_kept_between_steps() -> None:
    """Made from the tensors' order, shapes and dtypes only: what every group has alike."""
    tensors = [torch.zeros(1000), torch.zeros(1000), torch.zeros(10)]
    one, other = Buckets(cap_bytes=4096), Buckets(cap_bytes=4096)
    assert one.layout(tensors) == other.layout([t.clone() for t in tensors]) == [[0], [1, 2]]
    manager = TwoGroups(packed(one, tensors) * 2)
    one.finish(one.start(manager, tensors))
    flats = [flat.data_ptr() for flat in one._flats]
    one.finish(one.start(manager, tensors))
    assert [flat.data_ptr() for flat in one._flats] == flats  # no new buffers a step


def test_a_tensor_larger_than_the_cap_gets_a_bucket_of_its_own() -> None:
    assert Buckets(cap_bytes=8).layout([torch.zeros(1), torch.zeros(100), torch.zeros(1)]) == [
        [0], [1], [2]]  # fmt: skip
