"""Fails on rank 1 after joining the group; rank 0 then blocks in a barrier."""

import ddpkit

world = ddpkit.init(timeout=60)
if world.rank == 1:
    raise RuntimeError("deliberate failure on rank 1")
ddpkit.barrier()
