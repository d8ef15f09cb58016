"""Sharded data loading: each rank sees its own part of every epoch.

``prepare_loader`` always uses torch's ``DistributedSampler`` with the world's rank and size,
a world of one included (then it is one shard holding everything), so the sample order
depends only on the seed and the epoch, never on how many processes run. The Trainer calls
``set_epoch`` each epoch, so shuffling changes per epoch without the user remembering it.

Example:
    >>> import torch, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> data = torch.utils.data.TensorDataset(torch.arange(10.0))
    >>> loader = prepare_loader(data, batch_size=4, shuffle=False)
    >>> [len(b[0]) for b in loader]
    [4, 4, 2]
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from ddpkit.errors import ConfigError
from ddpkit.rendezvous import current_world


def prepare_loader(
    dataset: Dataset[Any],
    batch_size: int,
    shuffle: bool = True,
    *,
    seed: int = 0,
    drop_last: bool = False,
    **loader_kwargs: Any,
) -> DataLoader[Any]:
    """A DataLoader over this rank's shard of ``dataset``, ``batch_size`` samples per device.

    ``shuffle`` reshuffles every epoch (seeded by ``seed`` + epoch, identical on all ranks so
    shards never overlap). When the dataset does not divide by the world size, the sampler
    pads with repeated samples; ``drop_last=True`` drops the remainder instead. Other keyword
    arguments go to ``DataLoader`` (``num_workers``, ``collate_fn``, ...).

    Example:
        >>> import torch, ddpkit
        >>> _ = ddpkit.init()
        ddpkit: world size 1 ...
        >>> data = torch.utils.data.TensorDataset(torch.randn(8, 3))
        >>> len(prepare_loader(data, batch_size=2))
        4
        >>> ddpkit.shutdown()
    """
    _check_arguments(dataset, batch_size, loader_kwargs)
    world = current_world()
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset,
        num_replicas=world.world_size,
        rank=world.rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
    )
    loader_kwargs.setdefault("pin_memory", world.device.type == "cuda")
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **loader_kwargs)


def set_epoch(loader: DataLoader[Any], epoch: int) -> None:
    """Tell the loader's sampler which epoch starts, so its shuffle differs per epoch.

    Example:
        >>> import torch
        >>> loader = DataLoader(torch.utils.data.TensorDataset(torch.zeros(2)))
        >>> set_epoch(loader, 3)     # a plain sampler has nothing to set: no-op
    """
    set_sampler_epoch = getattr(getattr(loader, "sampler", None), "set_epoch", None)
    if callable(set_sampler_epoch):
        set_sampler_epoch(epoch)


def real_samples_on_rank(loader: Any) -> int | None:
    """How many of this rank's samples are real, not the sampler's padding (None: unknown).

    DistributedSampler pads the global order by repeating its first indices at the end, so
    rank r's real samples are its first ``len(range(r, N, W))``: shuffled or not.

    Example:
        >>> import torch
        >>> data = torch.utils.data.TensorDataset(torch.zeros(7))
        >>> sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=False)
        >>> real_samples_on_rank(DataLoader(data, sampler=sampler)), len(sampler)
        (3, 4)
    """
    sampler = getattr(loader, "sampler", None)
    if not isinstance(sampler, DistributedSampler) or sampler.drop_last:
        return None
    return len(range(sampler.rank, len(sampler.dataset), sampler.num_replicas))  # type: ignore[arg-type]


def _check_arguments(dataset: object, batch_size: int, loader_kwargs: dict[str, Any]) -> None:
    if isinstance(dataset, IterableDataset):
        raise ConfigError(
            "prepare_loader needs a map-style dataset (with __len__ and __getitem__) to shard "
            "it across ranks; an IterableDataset must shard itself using ddpkit.current_world()"
        )
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer (got {batch_size!r})")
    for taken in ("sampler", "batch_sampler"):
        if taken in loader_kwargs:
            raise ConfigError(
                f"prepare_loader sets the DataLoader's {taken} itself (it shards the data "
                f"across ranks); drop {taken}= and use shuffle=True/False"
            )
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise ConfigError("the dataset is empty: nothing to train on")


def batch_size_of(batch: Any) -> int:
    """Number of samples in a batch: the first dimension of its first tensor.

    Example:
        >>> batch_size_of((torch.zeros(5, 3), torch.zeros(5)))
        5
    """
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, (list, tuple)) and batch:
        return batch_size_of(batch[0])
    if isinstance(batch, dict) and batch:
        return batch_size_of(next(iter(batch.values())))
    raise ConfigError(f"cannot tell the batch size of a {type(batch).__name__}")
