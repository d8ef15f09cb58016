"""FSDP's and HSDP's mixed precision: a policy fixed when the model is sharded.

Autocast (``Trainer(precision="bf16")``) casts each op's inputs on the fly while the
parameters, their all-gathers and the gradient reduce-scatters stay fp32. FSDP2 can do
better: its ``MixedPrecisionPolicy`` all-gathers the parameters already in bf16 (half the
bytes on the wire, half the gathered memory) and computes in bf16, while the gradients are
reduced in fp32 and the sharded parameters and optimizer state stay fp32, as torchtitan's
recipes run. The policy is given to ``fully_shard``, so it is the strategy's option:
``FSDPStrategy(mixed_precision="bf16")`` (or a torch ``MixedPrecisionPolicy`` of your own).
The start-up line says it (``training FSDP (bf16 parameters, fp32 reduction)``) and the run
counts as bf16 for ``ddpkit verify``'s tolerances. fp16 needs loss scaling, which the Trainer's
``precision="fp16"`` brings: it is refused here with that advice.

Example:
    >>> policy_text(None), policy_precision(None)
    ('', None)
"""

from __future__ import annotations

from typing import Any

import torch

from ddpkit.errors import ConfigError

_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def shard_policy(request: Any) -> Any:
    """The ``MixedPrecisionPolicy`` for ``mixed_precision=request`` (None: FSDP's default,
    everything in the parameters' dtype).

    Example::

        shard_policy("bf16")   # MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                               #                      reduce_dtype=torch.float32, ...)
    """
    if request in (None, "fp32"):
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if isinstance(request, MixedPrecisionPolicy):
        return request
    if request == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if request == "fp16":
        raise ConfigError(
            'mixed_precision="fp16" would compute in fp16 without loss scaling; use '
            'Trainer(precision="fp16") (autocast with a scaler agreed across ranks), or '
            'mixed_precision="bf16"'
        )
    raise ConfigError(
        f'mixed_precision must be "bf16", "fp32" or a torch MixedPrecisionPolicy; got {request!r}'
    )


def policy_text(policy: Any) -> str:
    """How the policy reads in the start-up line ("" for none).

    Example::

        policy_text(shard_policy("bf16"))   # 'bf16 parameters, fp32 reduction'
    """
    if policy is None or policy.param_dtype is None:
        return ""
    reduce = policy.reduce_dtype or policy.param_dtype
    return f"{_name(policy.param_dtype)} parameters, {_name(reduce)} reduction"


def policy_precision(policy: Any) -> str | None:
    """The precision the forward runs in under the policy, as the Trainer names it.

    Example::

        policy_precision(shard_policy("bf16"))   # 'bf16'
    """
    if policy is None or policy.param_dtype is None:
        return None
    return _name(policy.param_dtype)


def _name(dtype: torch.dtype) -> str:
    return _NAMES.get(dtype, str(dtype).removeprefix("torch."))
