"""torch's Flight Recorder dumps (``torch._C._distributed_c10d``): NCCL's recorder, and the
one every other backend records into (torch 2.8 and newer); and the process groups this
process holds (``torch.distributed.distributed_c10d._world``).

Example::

    for dumper in flight_recorder_dumpers(): data = dumper(True, True, False)
"""

from __future__ import annotations

import contextlib
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


GROUPS = Internal(
    "torch.distributed.distributed_c10d._world.pg_map", "torch",
    "only the default group is held across the teardown; a gloo subgroup that a DDP model "
    "holds may be freed with the GIL held, which can hang the process's exit",
)  # fmt: skip


def process_groups() -> list[Any]:
    """Every process group this process has created and not destroyed, the default among
    them (empty where none). Holding them is what lets ``ddpkit.shutdown()`` free each one
    through its Python handle, whose release lets go of the GIL.

    Example:
        >>> process_groups()
        []
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return []
    GROUPS.used()
    world = getattr(dist.distributed_c10d, "_world", None)
    groups = getattr(world, "pg_map", None)
    if groups is None:
        GROUPS.gone()
        return [dist.group.WORLD]
    return list(groups)


def import_before_the_group() -> None:
    """Import what binds the default group when it is imported, before the group exists.

    ``torch.distributed.nn.functional`` writes ``group=group.WORLD`` as its functions'
    default argument, read once, at its import; DDP imports it (through
    ``torch.distributed._shard``). Imported after ``init_process_group``, it keeps the default
    group alive past ``destroy_process_group`` until the interpreter ends, and a gloo thread
    that frees a collective's tensor then aborts the process (exit 134). Imported before, the
    default is None, which means the default group at each call: the same behaviour.

    Example:
        >>> import_before_the_group()
    """
    with contextlib.suppress(ImportError):  # a build without it has nothing to bind
        import torch.distributed.nn.functional  # noqa: F401
