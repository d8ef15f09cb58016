"""``gather_for_metrics``: all ranks' predictions, exactly the samples one process would see.

To compute F1, AUROC or BLEU over a whole evaluation set, every rank's predictions must be
put together. Two things make a plain gather wrong: ``DistributedSampler`` repeats the first
samples so that the shards are equal (7 samples on 2 ranks are evaluated as 8), and it deals
samples out round-robin (rank 0 gets positions 0, 2, 4..., rank 1 gets 1, 3, 5...), so
concatenating by rank shuffles the order. ``gather_for_metrics`` gathers, puts the rows back
in the sampler's global order and drops the repeats: the result equals the list one process
computes over the loader, in the same order.

Collect this rank's outputs over the whole loader first, in the loader's order, then call it
once (with ``uneven="drop"`` the dropped tail is missing, as it is from the shards).

Example:
    >>> import torch, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> data = torch.utils.data.TensorDataset(torch.arange(5.0))
    >>> loader = ddpkit.prepare_loader(data, batch_size=2, shuffle=False)
    >>> preds = torch.cat([x * 10 for (x,) in loader])
    >>> gather_for_metrics(preds, loader)
    tensor([ 0., 10., 20., 30., 40.])
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import DistributedSampler

from ddpkit.errors import ConfigError
from ddpkit.runtime.allgather import all_gather


def gather_for_metrics(values: Any, loader: Any) -> Any:
    """Every rank's ``values`` over ``loader``, in the sampler's global order, repeats dropped.

    ``values`` is a tensor whose rows are this rank's samples in the loader's order, or a
    tuple, list or dict of such tensors (predictions and labels). A collective.

    Example::

        preds, labels = gather_for_metrics((torch.cat(preds), torch.cat(labels)), val_loader)
        f1 = sklearn.metrics.f1_score(labels.cpu(), preds.cpu())   # rank 0, or all
    """
    if isinstance(values, torch.Tensor):
        return _gather_rows(values, getattr(loader, "sampler", None))
    if isinstance(values, Mapping):
        return {key: gather_for_metrics(value, loader) for key, value in values.items()}
    if isinstance(values, (list, tuple)):
        return type(values)(gather_for_metrics(value, loader) for value in values)
    raise ConfigError(f"gather_for_metrics takes tensors (or a tuple/list/dict of them); got a "
                      f"{type(values).__name__}")  # fmt: skip


def _gather_rows(rows: torch.Tensor, sampler: Any) -> torch.Tensor:
    if not isinstance(sampler, DistributedSampler):
        return all_gather(rows)  # no shards to undo: ranks' rows in rank order
    share = len(sampler)
    if rows.shape[0] != share:
        raise ConfigError(
            f"gather_for_metrics got {rows.shape[0]} rows on rank {sampler.rank}, but its "
            f"shard of the loader holds {share} samples: pass one row per sample, for the "
            "whole loader, in the loader's order"
        )
    gathered = all_gather(rows)  # rank-major: [rank 0's share, rank 1's share, ...]
    world = sampler.num_replicas
    # Rank r's i-th sample sits at global position i * world + r of the sampler's order.
    interleaved = gathered.reshape(world, share, *rows.shape[1:]).transpose(0, 1)
    ordered = interleaved.reshape(world * share, *rows.shape[1:])
    return ordered[: len(sampler.dataset)]  # type: ignore[arg-type]
