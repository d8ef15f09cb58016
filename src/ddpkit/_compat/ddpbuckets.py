"""DDP's gradient buckets fixed when the model is wrapped (``Reducer._push_all_rebuilt_params``
and ``Reducer._rebuild_buckets``), so that a resumed run sums its gradients in the same order
as an uninterrupted one.

torch's DDP lays its buckets out in the parameters' reverse order for a process's first
step, then lays them out again in the order the gradients arrived. A ring all-reduce over 3
or more ranks adds each element's shares in an order set by where it falls in the bucket, so
the first step after a restart (the old layout) summed some elements in another order than the
uninterrupted run's same step (the new one): 1-2 ulps apart at 3 to 8 ranks (measured:
``tests/scale``), and apart for the rest of the run. Laid out once, at wrap time, every step
of every process uses the same buckets. The cost: the buckets follow the parameters' reverse
order rather than the gradients' arrival, which for most models is the same order.

Example::

    fix_bucket_layout(ddp_model)   # right after DistributedDataParallel(model)
"""

from __future__ import annotations

from typing import Any

from ddpkit._compat import Internal

BUCKETS = Internal(
    "torch.distributed.Reducer._push_all_rebuilt_params and _rebuild_buckets", "torch",
    "DDP lays its buckets out again after a process's first step, and a run resumed at 3 or "
    "more ranks may differ from an uninterrupted one in the last bits",
)  # fmt: skip


def fix_bucket_layout(ddp_model: Any) -> bool:
    """Lay ``ddp_model``'s buckets out now, for good (a collective: every rank, at wrap
    time). Whether they were; False where torch lacks the internals (said once) or DDP does
    not lay them out again anyway (``find_unused_parameters``).

    Example::

        fix_bucket_layout(DistributedDataParallel(model))
    """
    BUCKETS.used()
    reducer = getattr(ddp_model, "reducer", None)
    push = getattr(reducer, "_push_all_rebuilt_params", None)
    rebuild = getattr(reducer, "_rebuild_buckets", None)
    if push is None or rebuild is None:
        BUCKETS.gone()
        return False
    push()
    return bool(rebuild())
