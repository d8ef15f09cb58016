"""Rank 0 first inside ddpkit.main_first() (run with ddpkit run --nproc 2 --hang-timeout 3).

    main_first.py MODE OUT

MODE ``slow``: rank 0 spends 9 s (3x the hang timeout) in the block writing OUT/cache, which
rank 1 then reads. MODE ``stop``: rank 0 stops itself with SIGSTOP inside the block; rank 1
must name it and the block's line. Each rank writes the time (time.time(): the ranks share
this machine's clock) it got to each point to OUT/<point>-<rank>: ``reached`` (the ``with``),
``entered`` (inside the block), ``done`` (rank 0, the block's work written).
"""

import os
import signal
import sys
import time
from pathlib import Path

import ddpkit

mode, out = sys.argv[1], Path(sys.argv[2])
world = ddpkit.init()


def note(point: str) -> None:
    (out / f"{point}-{world.rank}").write_text(repr(time.time()))


note("reached")
with ddpkit.main_first():  # the line a report names
    note("entered")
    if world.rank == 0:
        if mode == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(9)
        (out / "cache").write_text("tokenized")
        note("done")
    cache = out / "cache"
    seen = cache.read_text() if cache.exists() else "no cache"  # a rank 1 let in too early
print(f"rank {world.rank} read {seen}", flush=True)
ddpkit.shutdown()
