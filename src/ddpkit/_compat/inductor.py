"""What ddpkit reaches for inside torch's compiler (inductor and dynamo): the precompiled-header
folder and its builder, the default cache folder, and the compile counters.

Example::

    if use_header_folder("runs/gpt/compile-cache/3f0c/precompiled_headers"): ...
"""

from __future__ import annotations

import getpass
import os
import tempfile
from collections.abc import Callable
from typing import Any

from ddpkit._compat import Internal

HEADERS = Internal(
    "torch._inductor.codecache._HEADER_DIR and _precompile_header", "torch",
    "inductor's precompiled headers are not kept with the run: a restart on a new node "
    "builds them again (about 4 s on 2 cores)",
)  # fmt: skip
DEFAULT_CACHE = Internal(
    "torch._inductor.runtime.cache_dir_utils.default_cache_dir", "torch",
    "torch's default compile-cache folder is taken to be <temporary folder>/torchinductor_<user>",
)  # fmt: skip
COUNTERS = Internal(
    "torch._dynamo.utils.counters", "torch",
    "the first step's line cannot say how many graphs came from the compile cache",
)  # fmt: skip


def _codecache() -> Any | None:
    """inductor's codecache module where it has the header folder and builder, else None."""
    HEADERS.used()
    from torch._inductor import codecache

    if hasattr(codecache, "_HEADER_DIR") and hasattr(codecache, "_precompile_header"):
        return codecache
    HEADERS.gone()
    return None


def use_header_folder(folder: str) -> bool:
    """Have inductor take its precompiled headers from ``folder`` (built there if missing);
    whether this torch could be told.

    Example::

        use_header_folder("runs/gpt/compile-cache/3f0c/precompiled_headers")
    """
    codecache = _codecache()
    if codecache is None:
        return False
    codecache._HEADER_DIR = folder
    codecache._HEADER_LOCK_DIR = os.path.join(folder, "locks")
    return True


def record_header_builds(record: Callable[[str], None]) -> bool:
    """Call ``record(path)`` with each precompiled header inductor builds or finds (the first
    ``record`` given in a process); whether this torch could be told.

    Example::

        record_header_builds(used.append)
    """
    codecache = _codecache()
    if codecache is None:
        return False
    build = codecache._precompile_header
    if getattr(build, "ddpkit_records", False):  # once a process
        return True

    def recorded(*args: Any, **kwargs: Any) -> str:
        path = build(*args, **kwargs)
        record(path)
        return str(path)

    recorded.ddpkit_records = True  # type: ignore[attr-defined]
    codecache._precompile_header = recorded
    return True


def default_cache_dir() -> str:
    """The folder torch compiles into when ``TORCHINDUCTOR_CACHE_DIR`` is not set.

    Example:
        >>> "torchinductor" in default_cache_dir()
        True
    """
    DEFAULT_CACHE.used()
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir as torchs
    except ImportError:
        DEFAULT_CACHE.gone()
        user = "".join(c if c.isalnum() else "_" for c in getpass.getuser())
        return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")
    return str(torchs())


def compile_counts() -> tuple[int, int, int] | None:
    """(graphs found in the compile cache, graphs compiled, graphs Dynamo captured) in this
    process; None where this torch keeps no such counters.

    Example::

        found, built, captured = compile_counts() or (0, 0, 0)
    """
    COUNTERS.used()
    try:
        from torch._dynamo.utils import counters  # imported already when a model is compiled
    except ImportError:
        COUNTERS.gone()
        return None
    inductor = counters["inductor"]
    found, built = inductor["fxgraph_cache_hit"], inductor["fxgraph_cache_miss"]
    return int(found), int(built), int(counters["stats"]["unique_graphs"])
