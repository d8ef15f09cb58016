"""A 2-worker job whose rank 1 is killed (SIGKILL) in its first attempt, after meeting: the
launcher restarts both, and the second attempt meets and leaves. Its wall time, less a
plain launch's, is what one restart costs."""

import os
import signal

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" and dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
dist.barrier()
dist.destroy_process_group()
