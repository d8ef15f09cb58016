"""Are the replicas still identical? Parameter fingerprints compared across ranks.

Under DDP every rank applies the same averaged gradients to the same weights, so the
replicas stay bit-for-bit identical; when they do not (a rank-dependent branch, a parameter
changed outside the optimizer, a model not wrapped for data parallelism, hardware faults),
every later step trains N different models and the job's result means nothing. Each rank
hashes each parameter's bits (exact, and independent of thread counts), one all-gather
compares the hashes, and only the tensors that differ are broadcast to measure by how much.
Buffers are left out: BatchNorm's running statistics legitimately differ per rank between
DDP's buffer broadcasts. Hashing costs about 20 ms per million parameters on a CPU core.

Example:
    >>> import torch
    >>> fingerprint(torch.tensor([1.5, -2.0])) == fingerprint(torch.tensor([1.5, -2.0]))
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ddpkit.errors import ConfigError, ReplicaDivergenceError
from ddpkit.parallel.strategy import strategy_of, unwrap_model
from ddpkit.runtime.collectives import all_gather_rows, all_reduce_max, broadcast_from_main

_MEASURED = 8  # differing tensors whose distance is measured (each costs a broadcast)
_CHUNK = 1 << 22  # elements hashed at a time: bounded temporary memory for huge tensors
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # 2**64 / golden ratio, as a signed int64
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class Divergence:
    """Which ranks and tensors differ from rank 0 at ``step``, and by how much.

    Example:
        >>> Divergence(4, [1], ["0.weight"], {"0.weight": 0.5}).error().ranks
        [1]
    """

    step: int
    ranks: list[int]
    tensors: list[str]
    max_abs: dict[str, float]

    def error(self) -> ReplicaDivergenceError:
        """The error the Trainer raises for this divergence."""
        shown = ", ".join(f"{name} by up to {diff:.3g}" for name, diff in self.max_abs.items())
        detail = (
            f" (max abs difference: {shown}). Replicas start identical and DDP gives every "
            "rank the same gradients, so something changed weights on some ranks only: code "
            "that depends on the rank, weights edited outside the optimizer, or a model not "
            'wrapped by prepare_model (strategy="none").'
        )
        return ReplicaDivergenceError(self.step, self.ranks, self.tensors, detail)


def fingerprint(tensor: torch.Tensor) -> int:
    """A 64-bit hash of the tensor's values, exact to the bit.

    Example:
        >>> fingerprint(torch.zeros(4)) == fingerprint(torch.tensor([0.0, 0.0, 1e-30, 1e-30]))
        False
    """
    return int(_hash(tensor).item())


def check_replicas(model: nn.Module, step: int) -> Divergence | None:
    """Compare every rank's parameters with rank 0's (a collective: all ranks call it).

    Example:
        >>> check_replicas(torch.nn.Linear(2, 2), step=1) is None  # a world of one
        True
    """
    names, params = _replicated_parameters(model)
    if not params:
        return None
    mine = torch.stack([_hash(p) for p in params])
    table = torch.stack(all_gather_rows(mine))  # [world, tensors]
    differs = table != table[0]
    if not bool(differs.any()):
        return None
    ranks = [int(r) for r in differs.any(dim=1).nonzero().flatten()]
    columns = [int(c) for c in differs.any(dim=0).nonzero().flatten()]
    measured = {names[c]: _distance(params[c]) for c in columns[:_MEASURED]}
    return Divergence(step, ranks, [names[c] for c in columns], measured)


def check_replicable(model: nn.Module) -> None:
    """Refuse the replica check where parameters are not replicas (FSDP shards them).

    Example:
        >>> check_replicable(torch.nn.Linear(2, 2))
    """
    strategy = strategy_of(model)
    if not strategy.replicas_identical:
        raise ConfigError(
            f"check_replicas_every compares full replicas, but {strategy.name.upper()} shards "
            'the parameters over the ranks; use it with strategy="ddp" (or leave it off under '
            f"{strategy.name.upper()})"
        )


def _replicated_parameters(model: nn.Module) -> tuple[list[str], list[torch.Tensor]]:
    named = list(unwrap_model(model).named_parameters())
    return [n for n, _ in named], [p.detach() for _, p in named]


def _hash(tensor: torch.Tensor) -> torch.Tensor:
    """Sum of each element's bits times an odd weight from its position, modulo 2**64.

    Integer sums wrap the same whatever the summation order, so equal tensors hash equal on
    any thread count; position weights make moved or pairwise-changed elements count (a
    plain XOR of the bits misses two equal elements that change alike).
    """
    flat = tensor.detach().reshape(-1)
    bits = flat.view(_INT_OF_SIZE[flat.element_size()])
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start in range(0, bits.numel(), _CHUNK):
        chunk = bits[start : start + _CHUNK].to(torch.int64)
        index = torch.arange(start, start + chunk.numel(), dtype=torch.int64, device=flat.device)
        total += (chunk * (index * _GOLDEN | 1)).sum()
    return total


def _distance(param: torch.Tensor) -> float:
    reference = broadcast_from_main(param)
    return float(all_reduce_max(float((param - reference).abs().max())))
