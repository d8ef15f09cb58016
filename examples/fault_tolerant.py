"""The wine classifier as replica groups that train on when one fails (experimental, torchft).

Each replica group is an ordinary ``ddpkit run`` job; across groups, gradients are averaged
each step over the groups alive at that step (``ddpkit.ReplicaGroups``, given to the
Trainer), and the batches are dealt among them (``groups.batches``), each sample once per
epoch. Kill a group and the
others go on at the smaller size without a restart; start it again and it heals from a
live peer. Needs ``pip install -e '.[ft]'``.

    ddpkit lighthouse --bind 127.0.0.1:29510 &                 # where the groups meet
    export TORCHFT_LIGHTHOUSE=http://127.0.0.1:29510
    DDPKIT_FT_GROUP=0 ddpkit run --nproc 1 examples/fault_tolerant.py &
    DDPKIT_FT_GROUP=1 ddpkit run --nproc 1 examples/fault_tolerant.py   # a second group

    ddpkit verify examples/fault_tolerant.py --replica-groups 2 --workers 1 --steps 20
    ddpkit verify examples/fault_tolerant.py --replica-groups 2 --workers 2 --steps 12 \
        --strategy fsdp                                         # FSDP inside each group
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import ddpkit
from wine import WineNet, load_data


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8, help="per rank, each step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--min-groups", type=int, default=1, help="fewest groups a step needs")
    parser.add_argument("--checkpoint-dir", default=None, help="every group's own folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp", "hsdp", "none"],
                        help="what trains inside each group")  # fmt: skip
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    ddpkit.init(seed=args.seed)
    train_set, test_set = load_data()
    groups = ddpkit.ReplicaGroups(min_groups=args.min_groups)  # the group: DDPKIT_FT_GROUP
    model = ddpkit.prepare_model(WineNet(), args.strategy)  # inside the group, as in any job
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    trainer = ddpkit.Trainer(model, optimizer, F.cross_entropy, checkpoint_dir=args.checkpoint_dir,
                             replica_groups=groups)  # fmt: skip
    batches = groups.batches(train_set, batch_size=args.batch_size, seed=args.seed)
    trainer.fit(batches, epochs=args.epochs)
    test = ddpkit.prepare_loader(test_set, batch_size=args.batch_size, shuffle=False)
    result = trainer.evaluate(test)
    ddpkit.print0(f"test accuracy {result['accuracy']:.4f}  test loss {result['loss']:.4f}")
    ddpkit.shutdown()


if __name__ == "__main__":
    main()
