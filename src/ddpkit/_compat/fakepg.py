"""torch's fake process group (``torch.testing._internal.distributed.fake_pg``): a world of
any size inside one process, whose collectives move nothing; and the dispatch mode
(``torch.utils._python_dispatch``) that sees each collective issued into it. torch's own tests and
torchtitan's dry run use it to build a job's model, shards and optimizer as one rank of a
world the machine does not have.

Example::

    join_fake_world(rank=0, world_size=1024)   # then dist.get_world_size() == 1024
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ddpkit._compat import Internal
from ddpkit.errors import ConfigError

# What sees every op this thread dispatches, c10d's collectives included (CommDebugMode's base)
DispatchMode = TorchDispatchMode

FAKE_STORE = Internal(
    "torch.testing._internal.distributed.fake_pg.FakeStore", "torch",
    "ddpkit plan cannot run (it needs torch's fake process group)",
)  # fmt: skip


def join_fake_world(rank: int, world_size: int) -> None:
    """The default process group: torch's fake backend, ``rank`` of ``world_size``.

    Example::

        join_fake_world(0, 64); dist.get_backend()   # 'fake'
    """
    FAKE_STORE.used()
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as err:
        FAKE_STORE.gone()
        raise ConfigError(f"ddpkit plan needs torch's fake process group, missing here: {err}"
                          ) from None  # fmt: skip
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)


UNBOX = Internal(
    "torch.distributed.ProcessGroup.unbox", "torch",
    "ddpkit plan counts every collective over the whole world (HSDP's groups not told apart)",
)  # fmt: skip


def group_size_of(value: object) -> int | None:
    """The size of the process group a c10d op received (as a ScriptObject); None for any
    other argument.

    Example:
        >>> group_size_of(3) is None
        True
    """
    if not isinstance(value, torch.ScriptObject) or "ProcessGroup" not in str(value._type()):
        return None
    UNBOX.used()
    unbox = getattr(dist.ProcessGroup, "unbox", None)
    if unbox is None:
        UNBOX.gone()
        return None
    return int(unbox(value).size())
