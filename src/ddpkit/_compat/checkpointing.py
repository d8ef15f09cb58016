"""torch's activation-checkpoint wrapper (``torch.distributed.algorithms._checkpoint``), which
FSDP recognises inside its units; ddpkit wraps the blocks a user names with it.

Example::

    wrapped = recompute_wrapper(block)   # its activations recomputed in backward
"""

from __future__ import annotations

from torch import nn

from ddpkit._compat import Internal
from ddpkit.errors import ConfigError

WRAPPER = Internal(
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper", "torch",
    "activation checkpointing cannot be applied",
)  # fmt: skip


def recompute_wrapper(block: nn.Module) -> nn.Module:
    """``block`` in torch's checkpoint wrapper, non-reentrant (the mode FSDP supports).

    Example::

        setattr(parent, name, recompute_wrapper(block))
    """
    WRAPPER.used()
    try:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl,
            checkpoint_wrapper,
        )
    except ImportError:
        WRAPPER.gone()
        raise ConfigError(
            f"{WRAPPER.where} is not in this torch: {WRAPPER.without}; drop "
            "activation_checkpointing, or use a torch ddpkit was checked with"
        ) from None
    wrapped: nn.Module = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    return wrapped
