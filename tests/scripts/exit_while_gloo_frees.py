"""A process that leaves its gloo group while one of gloo's threads holds the group's work
lock and waits for the GIL to free the last collective's tensor (a race at the end of every
job, made certain here): ``python exit_while_gloo_frees.py`` with a 1-rank torchrun
environment. ``ddpkit.shutdown()`` must return; before the fix it hung in
``~ProcessGroupGloo``, entered from the DDP reducer's release with the GIL held.
"""

import sys
import time

import torch
import torch.distributed as dist

import ddpkit
from ddpkit.runtime import session

ddpkit.init(backend="gloo", hang_timeout=0)
model = ddpkit.prepare_model(torch.nn.Linear(2, 1))  # its reducer holds the group
model(torch.ones(1, 2)).sum().backward()
model.__dict__["loop"] = model  # as a Trainer's parts do: only a collection frees the reducer
del model
destroy = dist.destroy_process_group


def destroy_then_free_in_gloo(*args: object, **kwargs: object) -> None:
    group = dist.group.WORLD
    destroy(*args, **kwargs)
    sys.setswitchinterval(5.0)  # this thread keeps the GIL from here ...
    # ... while gloo's thread copies 128 MiB (tens of ms) and then, holding its work lock,
    # frees tensors Python made, which takes the GIL.
    big = torch.ones(2**25)
    group.allgather([[torch.empty_like(big)]], [big])
    del big, group
    until = time.monotonic() + 0.5
    while time.monotonic() < until:
        pass


session.dist.destroy_process_group = destroy_then_free_in_gloo  # type: ignore[assignment]
ddpkit.shutdown()
print("left the group", flush=True)
