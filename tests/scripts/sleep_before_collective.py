"""Rank 1 sleeps forever before a collective that rank 0 enters: a classic hang."""

import time

import ddpkit


def main() -> None:
    world = ddpkit.init()
    ddpkit.all_reduce_sum(1.0)  # everyone gets here: the group works
    if world.rank == 1:
        time.sleep(3600)  # stands for a rank stuck in its own code (I/O, a deadlock, a bug)
    print(f"rank {world.rank} enters the collective at {time.time():.3f}", flush=True)
    ddpkit.all_reduce_sum(2.0)
    print(f"rank {world.rank} finished", flush=True)


if __name__ == "__main__":
    main()
