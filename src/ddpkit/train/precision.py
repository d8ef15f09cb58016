"""Mixed precision for the training loop: ``"fp32"``, ``"bf16"`` (autocast) or ``"fp16"``
(autocast + gradient scaling).

bf16 keeps fp32's exponent range, so it needs no loss scaling and runs on CPU and GPU alike.
fp16 underflows small gradients unless the loss is scaled up before ``backward`` and the
gradients scaled back down before the step, which torch's ``GradScaler`` does (skipping steps
whose gradients overflowed); its kernels are GPU-only. Parameters stay fp32 either way: only
the forward's matrix products run in 16 bits.

Example:
    >>> mp = MixedPrecision("bf16", torch.device("cpu"))
    >>> with mp.autocast():
    ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
    torch.bfloat16
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ddpkit.errors import ConfigError
from ddpkit.train.options import Precision


class MixedPrecision:
    """Autocast context, scaled backward and scaled optimizer step for one precision.

    Example:
        >>> mp = MixedPrecision("fp32", torch.device("cpu"))
        >>> mp.scaler is None
        True
    """

    def __init__(
        self, precision: Precision, device: torch.device, *, sharded: bool = False
    ) -> None:
        _check_supported(precision, device)
        self.precision = precision
        self.device = device
        self.scaler = _grad_scaler(device, sharded) if precision == "fp16" else None
        self._stepped = False  # a scaled step since the last update

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context the forward pass and the loss run under.

        Example:
            >>> with MixedPrecision("fp32", torch.device("cpu")).autocast():
            ...     pass
        """
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, with the loss scaled first under fp16.

        Example:
            >>> w = torch.ones(2, requires_grad=True)
            >>> MixedPrecision("fp32", torch.device("cpu")).backward((w * 3).sum())
            >>> w.grad
            tensor([3., 3.])
        """
        (self.scaler.scale(loss) if self.scaler else loss).backward()  # type: ignore[no-untyped-call]

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring the gradients back to their true size (before clipping them).

        Example:
            >>> weight = torch.nn.Parameter(torch.ones(1))
            >>> MixedPrecision("fp32", torch.device("cpu")).unscale(torch.optim.SGD([weight], lr=1))
        """
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``; under fp16 skipped when gradients overflowed. Call
        :meth:`update` once after the iteration's last optimizer (as torch's GradScaler wants).

        Example:
            >>> weight = torch.nn.Parameter(torch.ones(1))
            >>> weight.grad = torch.ones(1)
            >>> MixedPrecision("fp32", torch.device("cpu")).step(torch.optim.SGD([weight], lr=1))
            >>> weight.tolist()
            [0.0]
        """
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self._stepped = True

    def update(self) -> None:
        """Update the loss scale after this iteration's optimizer steps (fp16; else nothing).

        Example:
            >>> MixedPrecision("bf16", torch.device("cpu")).update()
        """
        if self.scaler is not None and self._stepped:
            self.scaler.update()
            self._stepped = False

    def state_dict(self) -> dict[str, Any]:
        """The grad scaler's state (empty without one), for checkpoints.

        Example:
            >>> MixedPrecision("bf16", torch.device("cpu")).state_dict()
            {}
        """
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output.

        Example:
            >>> MixedPrecision("bf16", torch.device("cpu")).load_state_dict({})
        """
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


def _grad_scaler(device: torch.device, sharded: bool) -> torch.amp.GradScaler:
    # With sharded gradients each rank sees only its shard, so whether any gradient overflowed
    # must be agreed over all ranks (an all-reduce), or ranks would skip different steps.
    if sharded:  # imported here: torch's FSDP package is only loaded when a model is sharded
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    return torch.amp.GradScaler(device.type)


def check_agrees(precision: str, strategy: Any) -> None:
    """The loop's ``precision`` and the strategy's sharding policy say one thing: the policy
    (``FSDPStrategy(mixed_precision=)``, fixed when the model is sharded) sets what a run
    computes in, and the loop's ``precision`` adds autocast and, for fp16, loss scaling. The
    same precision in both, or one left at fp32, is one choice; two different 16-bit
    precisions are refused with both named.

    Example:
        >>> class Sharded: compute_precision = "bf16"; name = "fsdp"
        >>> check_agrees("fp32", Sharded()); check_agrees("bf16", Sharded())
        >>> try:
        ...     check_agrees("fp16", Sharded())
        ... except ConfigError as err:
        ...     print(str(err)[:63])
        precision="fp16" and the fsdp strategy's mixed_precision="bf16"
    """
    policy = strategy.compute_precision
    if precision == "fp32" or policy in (None, "fp32", precision):
        return
    raise ConfigError(
        f'precision="{precision}" and the {strategy.name} strategy\'s mixed_precision='
        f'"{policy}" disagree: one run computes in one precision. Give the same to both, '
        f'or leave precision="fp32" (the policy alone sets it)'
    )


def _check_supported(precision: str, device: torch.device) -> None:
    # The name was checked with the other options; here, whether this device can run it.
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError(
            f'precision="fp16" needs a CUDA device (its loss scaling is GPU-only); this rank '
            f'runs on {device}. Use precision="bf16" on CPU.'
        )
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f'precision="bf16" is not supported by {torch.cuda.get_device_name(device)}; '
            'use precision="fp16" (with loss scaling) on this GPU'
        )
