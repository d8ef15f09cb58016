"""torch's Flight Recorder dumps (``torch._C._distributed_c10d``): NCCL's recorder, and the
one every other backend records into (torch 2.8 and newer).

Example::

    for dumper in flight_recorder_dumpers(): data = dumper(True, True, False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddpkit._compat import Internal

DUMPERS = Internal(
    "torch._C._distributed_c10d._dump_nccl_trace and _dump_fr_trace", "torch",
    "hang reports and failures say what each rank did, not which collective it waited in",
)  # fmt: skip
# NCCL's groups record into a recorder of their own (CUDA events), every other backend's
# into the shared one: a process with NCCL and gloo groups has collectives in both.
_NAMES = ("_dump_nccl_trace", "_dump_fr_trace")


def flight_recorder_dumpers() -> list[Callable[..., Any]]:
    """The dump functions this torch has, each ``f(include_stacks, only_active,
    include_collectives) -> bytes``; empty (said once) where it has none.

    Example:
        >>> all(callable(f) for f in flight_recorder_dumpers())
        True
    """
    DUMPERS.used()
    from torch._C import _distributed_c10d

    found = [getattr(_distributed_c10d, name, None) for name in _NAMES]
    dumpers = [f for f in found if callable(f)]
    if not dumpers:
        DUMPERS.gone()
    return dumpers
