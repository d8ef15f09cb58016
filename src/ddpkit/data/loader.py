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

import itertools
import math
from collections.abc import Iterator, Sized
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, Sampler

from ddpkit._core.validate import check_choice, check_positive_int
from ddpkit.data.samples import SampleIndex, sample_indices
from ddpkit.data.stream import StreamLoader, rank_share
from ddpkit.errors import ConfigError
from ddpkit.runtime.seeding import configured_seed, rank_seed
from ddpkit.runtime.session import current_world, reference_world_size

BatchPolicy = Literal["per_device", "global"]
BATCH_POLICIES: tuple[BatchPolicy, ...] = get_args(BatchPolicy)
LRScaling = Literal["none", "linear", "sqrt"]
LR_SCALING: tuple[LRScaling, ...] = get_args(LRScaling)
UnevenPolicy = Literal["pad", "drop"]
UNEVEN: tuple[UnevenPolicy, ...] = get_args(UnevenPolicy)


def prepare_loader(
    dataset: Dataset[Any],
    batch_size: int | BatchPlan,
    shuffle: bool = True,
    *,
    batch_policy: BatchPolicy = "per_device",
    uneven: UnevenPolicy = "pad",
    seed: int | None = None,
    **loader_kwargs: Any,
) -> DataLoader[Any]:
    """A DataLoader over this rank's shard of ``dataset``.

    ``batch_policy="per_device"`` gives each rank ``batch_size`` samples per step (the global
    batch grows with the world); ``"global"`` splits ``batch_size`` over the ranks (the global
    batch stays what one process would use; it must divide). A :class:`BatchPlan` from
    :func:`plan_batch` may be passed instead. ``shuffle`` reshuffles every epoch, seeded by
    ``seed`` (default: the seed given to ``ddpkit.init``, else 0) + epoch, identically on all
    ranks so shards never overlap. When the dataset does not divide by the world size,
    ``uneven="pad"`` repeats a few samples so every rank has as many (evaluation leaves the
    repeats out of its metrics); ``"drop"`` leaves the remainder out. Other keyword arguments
    go to ``DataLoader`` (``num_workers``, ``collate_fn``, ``drop_last`` for a short last
    batch, ...); its workers get per-rank seeds, so random augmentation differs per rank.

    Example:
        >>> import torch, ddpkit
        >>> _ = ddpkit.init()
        ddpkit: world size 1 ...
        >>> data = torch.utils.data.TensorDataset(torch.randn(8, 3))
        >>> len(prepare_loader(data, batch_size=2))
        4
        >>> ddpkit.shutdown()
    """
    world = current_world()
    plan = batch_size if isinstance(batch_size, BatchPlan) else plan_batch(batch_size, batch_policy)
    _check_arguments(dataset, uneven, loader_kwargs)
    seed = seed if seed is not None else (configured_seed() or 0)
    loader_kwargs.setdefault("pin_memory", world.device.type == "cuda")
    loader_kwargs.setdefault(
        "generator", torch.Generator().manual_seed(rank_seed(seed, world.rank))
    )
    if isinstance(dataset, IterableDataset):
        return _stream_loader(dataset, plan, uneven, loader_kwargs)
    shards = reference_world_size() or 1  # > 1 only in `ddpkit verify`'s reference run
    _check_enough_samples(len(cast(Sized, dataset)), shards if shards > 1 else world.world_size)
    sampler: Sampler[int] = (GlobalOrderSampler if shards > 1 else ResumableDistributedSampler)(
        dataset,
        num_replicas=shards if shards > 1 else world.world_size,
        rank=world.rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=uneven == "drop",
    )
    batch = plan.per_device * shards
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, **loader_kwargs)
    loader.ddpkit_batch_plan = plan  # read by the startup line and ddpkit bench
    # Every rank's shard holds as many samples (padded or cut), so every rank has as many
    # batches: the loop need not ask the ranks each epoch (one collective saved).
    loader.ranks_in_step = True
    return loader


def _stream_loader(
    dataset: IterableDataset[Any], plan: BatchPlan, uneven: str, loader_kwargs: dict[str, Any]
) -> DataLoader[Any]:
    """This rank's share of a stream, ending each epoch at the same step on every rank."""
    if reference_world_size():
        raise ConfigError(
            "ddpkit verify does not compare runs over an IterableDataset yet (its reference "
            "process cannot read N ranks' shares in their order); verify with a map-style "
            "dataset, or check the stream's training with `ddpkit run` directly"
        )
    world = current_world()
    share = rank_share(dataset, world.rank, world.world_size)
    loader = StreamLoader(share, uneven, batch_size=plan.per_device, **loader_kwargs)
    loader.ddpkit_batch_plan = plan
    return loader


class ResumableDistributedSampler(DistributedSampler[Any]):
    """torch's ``DistributedSampler`` whose epoch can begin part-way through, at this world
    size or another.

    The epoch's order over the dataset's global index is DistributedSampler's (shuffled by
    seed + epoch), whatever the world size, and rank r of W takes its positions r, r+W, ...:
    after b batches of B on each of W ranks, exactly the first b*B*W positions are done.
    :meth:`start_at` (a global position) deals out the rest over this sampler's ranks the
    same way, so a run resumed on M ranks after N goes on with the samples not yet done, each
    once (the usual padding aside: ``drop_last=False`` repeats a few of the epoch's first
    samples so that the rest divides by M). From position 0, and resumed at the same world
    size, it is DistributedSampler sample for sample; ``len()`` is the whole epoch's. Each
    index is a :class:`~ddpkit.data.samples.SampleIndex` (an int that knows its epoch and
    seed, for :func:`~ddpkit.data.samples.sample_generator`).

    Example:
        >>> data = torch.utils.data.TensorDataset(torch.arange(6))
        >>> sampler = ResumableDistributedSampler(data, num_replicas=2, rank=0, shuffle=False)
        >>> sampler.start_at(2); list(sampler), len(sampler)
        ([2, 4], 3)
        >>> alone = ResumableDistributedSampler(data, num_replicas=1, rank=0, shuffle=False)
        >>> alone.start_at(2); list(alone)       # the same epoch, on one rank from here
        [2, 3, 4, 5]
        >>> sampler.set_epoch(1); list(sampler)
        [0, 2, 4]
    """

    def __init__(self, dataset: Dataset[Any], *args: Any, **kwargs: Any) -> None:
        super().__init__(dataset, *args, **kwargs)
        self.start = 0

    def start_at(self, position: int) -> None:
        """Begin the current epoch after its first ``position`` samples (over all ranks)."""
        self.start = position

    def set_epoch(self, epoch: int) -> None:
        """Begin ``epoch`` from its first sample, reshuffled as DistributedSampler does."""
        super().set_epoch(epoch)
        self.start = 0

    def remaining(self) -> int:
        """How many samples this rank reads from :meth:`start_at`'s position to the end."""
        return len(self._dealt())

    def __iter__(self) -> Iterator[SampleIndex]:
        return sample_indices(self._dealt(), self.epoch, self.seed)

    def _dealt(self) -> list[int]:
        """This rank's share of the epoch from :meth:`start_at`'s position on."""
        order = self._epoch_order()
        left = len(order) - self.start
        if left <= 0:
            return []
        if self.drop_last:
            rest = order[self.start : self.start + left // self.num_replicas * self.num_replicas]
        else:  # padded from the epoch's head, as DistributedSampler pads
            padding = itertools.islice(itertools.cycle(order), -left % self.num_replicas)
            rest = order[self.start :] + list(padding)
        return rest[self.rank :: self.num_replicas]

    def _epoch_order(self) -> list[int]:
        """DistributedSampler's order of the whole epoch, before padding."""
        size = len(cast(Sized, self.dataset))
        if not self.shuffle:
            return list(range(size))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order: list[int] = torch.randperm(size, generator=generator).tolist()
        return order


class GlobalOrderSampler(Sampler[int]):
    """The order N ``DistributedSampler`` shards cover together, read by one process.

    Rank r of N takes positions r, r+N, r+2N, ... of the shuffled (and padded) order, so at
    step s the N ranks' batches of B together hold positions s*N*B .. (s+1)*N*B-1: exactly
    what one process reading this order in batches of N*B sees. ``ddpkit verify``'s
    single-process reference uses it to train on the same samples, step by step, as N ranks.

    Example:
        >>> data = torch.utils.data.TensorDataset(torch.arange(5))
        >>> list(GlobalOrderSampler(data, num_replicas=2, rank=0, shuffle=False))
        [0, 1, 2, 3, 4, 0]
    """

    deterministic = True  # iterating it twice gives the same order (the sampler check)

    def __init__(self, dataset: Dataset[Any], num_replicas: int, rank: int = 0, **options: Any):
        self.shards: list[DistributedSampler[Any]] = [  # the ranks' own samplers, exactly
            ResumableDistributedSampler(dataset, num_replicas=num_replicas, rank=r, **options)
            for r in range(num_replicas)
        ]

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch``, as each shard would."""
        for shard in self.shards:
            shard.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        columns = [list(shard) for shard in self.shards]
        return iter([column[j] for j in range(len(columns[0])) for column in columns])

    def __len__(self) -> int:
        return sum(len(shard) for shard in self.shards)


@dataclass(frozen=True)
class BatchPlan:
    """How a batch size is spread over the ranks, and the learning rate that goes with it.

    ``base_batch`` is the batch one process would use (what the LR was tuned for);
    ``global_batch`` is what one optimizer step sees over all ranks and micro-steps.

    Example:
        >>> BatchPlan(per_device=32, global_batch=64, base_batch=64, lr=0.1).describe()
        'global batch 64 (32 per device), lr 0.1'
    """

    per_device: int
    global_batch: int
    base_batch: int
    lr: float | None = None
    policy: BatchPolicy = "per_device"
    lr_scaling: LRScaling = "none"

    def describe(self) -> str:
        """One line for logs.

        Example:
            >>> BatchPlan(8, 16, 8).describe()
            'global batch 16 (8 per device)'
        """
        text = f"global batch {self.global_batch} ({self.per_device} per device)"
        return text + (f", lr {self.lr:g}" if self.lr is not None else "")


def plan_batch(
    batch_size: int,
    policy: BatchPolicy = "per_device",
    *,
    accumulate: int = 1,
    lr: float | None = None,
    lr_scaling: LRScaling = "none",
) -> BatchPlan:
    """Split ``batch_size`` by ``policy`` and scale ``lr`` by ``lr_scaling`` for this world.

    ``lr_scaling`` multiplies ``lr`` by the ratio of the global batch to ``batch_size``
    (``"linear"``, Goyal et al.'s rule for SGD) or its square root (``"sqrt"``, often better
    for Adam); ``"none"`` keeps it. With ``policy="global"`` the ratio is only ``accumulate``.

    Example:
        >>> import ddpkit
        >>> _ = ddpkit.init()
        ddpkit: world size 1 ...
        >>> plan_batch(32, "per_device", accumulate=4, lr=0.1, lr_scaling="linear")
        BatchPlan(per_device=32, global_batch=128, base_batch=32, lr=0.4, policy='per_device',
                  lr_scaling='linear')
        >>> ddpkit.shutdown()
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("accumulate", accumulate)
    check_choice("batch_policy", policy, BATCH_POLICIES)
    check_choice("lr_scaling", lr_scaling, LR_SCALING)
    world_size = reference_world_size() or current_world().world_size
    if policy == "global" and batch_size % world_size:
        raise ConfigError(
            f"batch_policy='global' splits the batch of {batch_size} over {world_size} ranks, "
            f"which does not divide; use a multiple of {world_size} (e.g. "
            f"{batch_size + world_size - batch_size % world_size}) or batch_policy='per_device'"
        )
    per_device = batch_size // world_size if policy == "global" else batch_size
    global_batch = per_device * world_size * accumulate
    ratio = global_batch / batch_size
    multiplier = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[lr_scaling]
    scaled = None if lr is None else lr * multiplier
    return BatchPlan(per_device, global_batch, batch_size, scaled, policy, lr_scaling)


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


def _check_enough_samples(samples: int, ranks: int) -> None:
    # DistributedSampler would hand some ranks copies of others' samples: all padding.
    if samples < ranks:
        raise ConfigError(
            f"the dataset has {samples} sample(s) but the job has {ranks} ranks: every rank "
            f"needs at least one; launch --nproc {samples} or fewer, or use more data"
        )


def _check_arguments(dataset: object, uneven: str, loader_kwargs: dict[str, Any]) -> None:
    check_choice("uneven", uneven, UNEVEN)
    for taken in ("sampler", "batch_sampler"):
        if taken in loader_kwargs:
            raise ConfigError(
                f"prepare_loader sets the DataLoader's {taken} itself (it shards the data "
                f"across ranks); drop {taken}= and use shuffle=True/False"
            )
    if not isinstance(dataset, IterableDataset) and len(dataset) == 0:  # type: ignore[arg-type]
        raise ConfigError("the dataset is empty: nothing to train on")
