"""``strategy="dp"``: torch's ``DataParallel``, one process driving every visible GPU.

Slower than DDP (one Python thread feeds all GPUs, and the model is copied to them every
step); kept because the tutorials compare the two. Without two GPUs it says so and runs
unwrapped.

Example:
    >>> import torch
    >>> DP.owns(torch.nn.DataParallel(torch.nn.Linear(1, 1)))
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn.parallel import DataParallel

from ddpkit._core.log import logger
from ddpkit.errors import ConfigError
from ddpkit.parallel.base import ModuleWrapperStrategy

if TYPE_CHECKING:
    from ddpkit.env.world import World


class DPStrategy(ModuleWrapperStrategy):
    """One process, every GPU: replicas are copied from GPU 0 at each forward.

    Example:
        >>> DPStrategy().uneven_batches
        'free'
    """

    name = "dp"
    wrapper = DataParallel

    def wrap(self, model: nn.Module, world: World) -> nn.Module:
        if world.world_size > 1:
            raise ConfigError(
                f'strategy="dp" drives all GPUs from one process, but this job has '
                f'{world.world_size} processes; use strategy="ddp" (one process per GPU), '
                "or start a single process"
            )
        gpus = torch.cuda.device_count()
        if gpus < 2:
            logger.info(
                f'strategy="dp" needs 2 or more GPUs and {gpus} is visible; '
                f"the model runs unwrapped on {world.device}"
            )
            return model.to(world.device)
        return DataParallel(model.to("cuda:0"))


DP = DPStrategy()
