"""Prints what a launcher gave this worker: torchrun's variables and the arguments.

The torchrun compatibility test runs it (as a script or as a module) under both `torchrun`
and `ddpkit run` and compares the lines.
"""

import os
import sys

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_NAME")
seen = " ".join(f"{key}={os.environ.get(key)}" for key in KEYS)
# One write each: lines of several workers sharing a pipe must not interleave.
os.write(1, f"SEEN {seen} ARGS {sys.argv[1:]}\n".encode())
os.write(2, f"to stderr from rank {os.environ.get('RANK')}\n".encode())
