"""A 2-worker job that only meets and leaves: measures the launcher, not training."""

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
