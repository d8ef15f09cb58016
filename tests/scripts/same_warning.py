"""Every rank prints the same warning and a line of its own; ``fail`` as the first argument
makes rank 1 raise afterwards: ``ddpkit run --nproc 4 same_warning.py [fail]``."""

import sys
import time
import warnings

import ddpkit

world = ddpkit.init(hang_timeout=0)
ddpkit.barrier()  # the ranks print at about the same time, as after a shared import
warnings.warn("the old API is deprecated; use the new one", UserWarning, stacklevel=1)
print(f"rank {world.rank} holds shard {world.rank}")
if sys.argv[1:] == ["fail"] and world.rank == 1:
    print(f"rank 1 fails at {time.time():.3f}", flush=True)
    raise RuntimeError("rank 1 failed on purpose")
ddpkit.barrier()
