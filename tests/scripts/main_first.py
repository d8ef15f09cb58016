"""Rank 0 first inside ddpkit.main_first() (run with ddpkit run --nproc 2 --hang-timeout 3).

    main_first.py MODE OUT

MODE ``slow``: rank 0 spends 9 s (3x the hang timeout) in the block writing OUT/cache, which
rank 1 then reads. MODE ``stop``: rank 0 writes OUT/entered (the time) and stops itself with
SIGSTOP inside the block; rank 1 must name it and the block's line.
"""

import os
import signal
import sys
import time
from pathlib import Path

import ddpkit

mode, out = sys.argv[1], Path(sys.argv[2])
world = ddpkit.init()
with ddpkit.main_first():  # the line a report names
    if world.rank == 0:
        if mode == "stop":
            (out / "entered").write_text(str(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(9)
        (out / "cache").write_text("tokenized")
    seen = (out / "cache").read_text()
print(f"rank {world.rank} read {seen}", flush=True)
ddpkit.shutdown()
