"""Work rank 0 does first (tokenizing, downloading, building a cache) while the others wait.

With ``dist.barrier()`` the other ranks wait in a collective: they time out after the process
group's timeout (30 minutes by default, so a long download kills the job), and if rank 0 dies
or stalls they wait that long without knowing why. :func:`main_first` waits in the job's
store instead, with rank 0's heartbeat: a block that takes hours is fine while rank 0 is
alive, and a rank 0 that stopped beating (killed, SIGSTOPped, frozen) is named with the
block's line within the hang timeout. Then the other ranks run the block (to read the cache).

Example:
    >>> import ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> with main_first():          # one process: the block just runs
    ...     cached = "tokenized"
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from torch.distributed import Store

from ddpkit._compat.python import caller_frame
from ddpkit._core.log import EVERY_RANK, logger
from ddpkit.errors import MainRankStalledError
from ddpkit.runtime.session import current_world
from ddpkit.runtime.watchdog import watched_connection

BEAT_S = 1.0  # rank 0's heartbeat while it runs the block
_POLL_S = 0.2
_calls = itertools.count()  # the n-th main_first of this process: the same on every rank


@contextlib.contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 runs the block first; every other rank then runs it (see the module's doc).

    Example::

        with ddpkit.main_first():
            dataset = load_dataset("wikitext", cache_dir="cache")   # downloads once
    """
    where = _call_site()
    world, connection = current_world(), watched_connection("main_first")
    if world.world_size == 1 or connection is None:
        with _barrier_fallback(world.world_size, connection is None):
            yield
        return
    store, timeout_s = connection
    key = str(next(_calls))
    if world.rank == 0:
        with _beating(store, key, where, timeout_s):
            yield
    else:
        _wait_for_main(store, key, where, timeout_s)
        yield


@contextlib.contextmanager
def _beating(store: Store, key: str, where: str, timeout_s: float = 600.0) -> Iterator[None]:
    """Rank 0 inside the block: a heartbeat (every second, or a quarter of a short hang
    timeout); at the end, done or failed."""
    stop, every = threading.Event(), min(BEAT_S, timeout_s / 4)

    def beat() -> None:
        while not stop.wait(every):
            store.add(f"{key}/beat", 1)

    store.add(f"{key}/beat", 1)
    thread = threading.Thread(target=beat, name="ddpkit-main-first", daemon=True)
    thread.start()
    outcome = "failed"
    try:
        yield
        outcome = "done"
    finally:
        stop.set()
        thread.join()
        store.set(f"{key}/outcome", outcome)


def _wait_for_main(store: Store, key: str, where: str, timeout_s: float) -> None:
    """Wait for rank 0's outcome while its heartbeat goes on; name it when it stops."""
    beats, since = -1, time.monotonic()
    while not store.check([f"{key}/outcome"]):
        now_beats = store.add(f"{key}/beat", 0)
        if now_beats != beats:
            beats, since = now_beats, time.monotonic()
        silent = time.monotonic() - since
        if silent > timeout_s:
            _report(_silence(where, beats, silent, timeout_s))
        time.sleep(min(_POLL_S, timeout_s / 4))
    if bytes(store.get(f"{key}/outcome")).decode() != "done":
        _report(f"rank 0 failed inside main_first() at {where}; its error is in its output")


def _silence(where: str, beats: int, silent: float, timeout_s: float) -> str:
    if beats <= 0:
        return (f"rank 0 did not reach main_first() at {where} within the hang timeout "
                f"({timeout_s:g} s)")  # fmt: skip
    return (f"rank 0 stopped inside main_first() at {where}: no heartbeat for {silent:.0f} s "
            f"(hang timeout {timeout_s:g} s); it died, was stopped, or is frozen in native "
            "code; its own output says which")  # fmt: skip


def _report(text: str) -> NoReturn:
    logger.error(text, extra=EVERY_RANK)  # now: the job's end comes later
    raise MainRankStalledError(text)


@contextlib.contextmanager
def _barrier_fallback(world_size: int, unwatched: bool) -> Iterator[None]:
    """One process: just the block. Without a watchdog (hang_timeout=0): a plain barrier
    around rank 0's turn, with its collective timeout."""
    if world_size == 1 or not unwatched:
        yield
        return
    from ddpkit.runtime.collectives import barrier, is_main

    if is_main():
        yield
        barrier()
    else:
        barrier()
        yield


def _call_site() -> str:
    """``file.py:line`` of the ``with main_first():`` statement."""
    frame = caller_frame(3)  # _call_site <- main_first <- contextmanager's __enter__ <- caller
    if frame is None:
        return "the with statement"
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
