"""A stream whose ranks' shares differ by 11 batches, trained by the Trainer:
``ddpkit run --nproc 2 stream_train.py FOLDER [KILL_AT_STEP] [--hf]``.

Five shards of 24, 4, 24, 4 and 4 items go round-robin to 2 ranks x 2 loader workers: rank 0
reads 52 items (13 batches of 4), rank 1 reads 8 (2 batches). Every rank appends the item ids
of each batch it trains on to FOLDER/seen-rank<R>-attempt<A>.txt. With KILL_AT_STEP, rank 1
kills itself with SIGKILL at that step of the first attempt (run it with --max-restarts 1).
With --hf the same items come from a Hugging Face ``datasets.IterableDataset`` of the same
shards (shuffled by a buffer), which ddpkit splits with the library's own split_dataset_by_node.
"""

import os
import signal
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import IterableDataset

import ddpkit

SHARD_SIZES = [24, 4, 24, 4, 4]
hugging_face = "--hf" in sys.argv
args = [arg for arg in sys.argv[1:] if arg != "--hf"]
folder = Path(args[0])
kill_at = int(args[1]) if len(args) > 1 else None
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


class ShardedStream(IterableDataset):
    """Items (id, features, label), shuffled within each shard by the epoch."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):  # the whole stream, as one process would read it
        for shard in self.shards():
            yield from shard

    def shards(self):
        starts = [sum(SHARD_SIZES[:k]) for k in range(len(SHARD_SIZES))]
        return [self._items(start, size) for start, size in zip(starts, SHARD_SIZES, strict=True)]

    def _items(self, start: int, size: int):
        order = torch.randperm(
            size, generator=torch.Generator().manual_seed(self.epoch * 97 + start)
        )
        for offset in order.tolist():
            yield item(start + offset)


def item(index: int) -> tuple[int, torch.Tensor, int]:
    features = torch.randn(4, generator=torch.Generator().manual_seed(index))
    return index, features, int(features.sum() > 0)


def hugging_face_stream():
    import datasets

    def items(shards):
        for start, size in shards:
            for index in range(start, start + size):
                _, features, label = item(index)
                yield {"id": index, "features": features.tolist(), "label": label}

    starts = [sum(SHARD_SIZES[:k]) for k in range(len(SHARD_SIZES))]
    shards = [list(pair) for pair in zip(starts, SHARD_SIZES, strict=True)]
    stream = datasets.IterableDataset.from_generator(items, gen_kwargs={"shards": shards})
    return stream.shuffle(seed=0, buffer_size=8).with_format("torch")


class RecordingTrainer(ddpkit.Trainer):
    def training_step(self, batch):
        if isinstance(batch, dict):  # a Hugging Face stream's examples
            batch = batch["id"], batch["features"], batch["label"]
        ids, features, labels = batch
        if kill_at is not None and attempt == 0 and self.world.rank == 1 and self.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        with open(folder / f"seen-rank{self.world.rank}-attempt{attempt}.txt", "a") as seen:
            seen.write(f"{self.epoch} {self.step} {' '.join(map(str, ids.tolist()))}\n")
        return F.cross_entropy(self.model(features), labels)


world = ddpkit.init(seed=0)
model = ddpkit.prepare_model(torch.nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
stream = hugging_face_stream() if hugging_face else ShardedStream()
loader = ddpkit.prepare_loader(stream, batch_size=4, num_workers=2)
trainer = RecordingTrainer(
    model,
    optimizer,
    checkpoint_dir=str(folder / "ckpt"),
    save_every_steps=3,
    log_dir=str(folder / "logs"),
)
trainer.fit(loader, epochs=3)
