"""One replica group of a fault-tolerant job (ddpkit.ReplicaGroups), as ``ddpkit run``
starts it: ``DDPKIT_FT_GROUP`` names the group, ``TORCHFT_LIGHTHOUSE`` the lighthouse.

``python replica_group.py OUT EPOCHS [FACE] [--drop-at K] [--min-groups G]`` trains a small
model on 48 samples in batches of 4, dealt among the groups alive at each step
(ReplicaBatches). FACE: ``loop`` (TrainLoop, a pause a step so that a test can kill it
mid-run; the default), ``trainer`` (Trainer.fit, a per-step LR scheduler, no pause),
``patient`` (an exchange or quorum may take 30 s, not 10), ``resumable`` (a checkpoint every
5 steps in OUT.ckpt, resumed from when started again). ``--drop-at K``: this group reports an
error before the vote of its K-th update, which torchft then drops (give it to every group:
the exchange failed everywhere). ``--min-groups G``: a step needs G groups. ``--timeout S``:
how long an exchange or a quorum may take (default 10 s; ``patient``: 30). ``--strategy S``:
what trains inside the group (default ``ddp``; ``fsdp``: sharded over its ranks).
``--start-after FILE``: train once FILE exists (its manager already started). ``--join-after
FILE``: start the group at all (its manager, which the lighthouse counts from then on) once
FILE exists: a group restarted by torch's agent can be kept out while another trains alone,
as a slow restart would be (a group alive but not in a quorum blocks a quorum of the rest:
torchft's lighthouse needs more than half the live groups). ``--hold FILE``:
once FILE holds a step number and this group has taken that many steps, it waits for
FILE.go before going on (a test starts another group meanwhile, which this one must outlive).

After each batch its rank 0 prints ``step N torchft M``: the steps ddpkit and torchft count (equal
unless a dropped step was counted). After each committed step it appends a line to
OUT.trained.jsonl: the epoch, the step, the groups in it and the samples this rank trained
(their dataset indices, which every batch carries: what was trained, not what the ledger
says was dealt), so a group killed mid-run leaves its record up to its last step. At the
end it writes the final weights to OUT and the epochs trained to OUT.json.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import ddpkit
from ddpkit.faulttolerance.batches import ReplicaBatches
from ddpkit.parallel.strategy import strategy_of


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner, self.outer = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(torch.relu(self.inner(x)))


class Witness(ddpkit.Callback):
    """What each committed step trained on this rank (appended to ``record``), and both step
    counts after each batch; at update ``drop_at``, an error reported to torchft before the
    vote. On every rank: each records its own samples, and each waits when held."""

    rank_zero_only = False

    def __init__(self, groups: ddpkit.ReplicaGroups, batches: ReplicaBatches, drop_at: int | None,
                 record: str, hold: str | None) -> None:  # fmt: skip
        self.groups, self.batches, self.drop_at = groups, batches, drop_at
        self.record = open(record, "a")  # noqa: SIM115 (open for the whole run)
        self.updates, self.before, self.hold = 0, 0, hold

    def on_train_batch_start(self, trainer, batch) -> None:
        self.before, self.updates = trainer.step, self.updates + 1
        if self.updates == self.drop_at:  # after the step's quorum, before its vote
            torchft = self.groups.manager.manager
            torchft.report_error(RuntimeError("injected: the exchange failed"))

    def on_train_batch_end(self, trainer, batch, metrics) -> None:
        manager = self.groups.manager.manager  # torchft's
        if trainer.step != self.before:  # committed (a filler batch trains nothing)
            samples = [] if self.batches.idle else sorted(batch[2].tolist())
            line = {"epoch": self.batches.epoch, "step": trainer.step, "samples": samples,
                    "groups": manager.num_participants(), "at": time.time()}  # fmt: skip
            self.record.write(json.dumps(line) + "\n")
            self.record.flush()
        if ddpkit.get_rank() == 0:  # one count a group
            print(f"step {trainer.step} torchft {manager.current_step()}", flush=True)
        self._wait_if_held(trainer.step)

    def _wait_if_held(self, step: int) -> None:
        if not self.hold or not os.path.exists(self.hold):
            return
        text = Path(self.hold).read_text().strip()
        while text and step >= int(text) and not os.path.exists(f"{self.hold}.go"):
            time.sleep(0.05)


def wait_for(path: str | None) -> None:
    """The groups started (torchft's manager of each at the lighthouse), none has trained:
    a test makes them start together, so that neither ends before the other is there."""
    while path and not os.path.exists(path):
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("epochs", type=int)
    parser.add_argument("face", nargs="?", default="loop",
                        choices=["loop", "trainer", "patient", "resumable"])  # fmt: skip
    parser.add_argument("--drop-at", type=int, default=None)
    parser.add_argument("--min-groups", type=int, default=1)
    parser.add_argument("--hold", default=None)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--strategy", default="ddp", help="what trains inside the group")
    parser.add_argument("--start-after", default=None, help="train once this file exists")
    parser.add_argument("--join-after", default=None, help="join the groups once it exists")
    args = parser.parse_args()
    ddpkit.init(hang_timeout=0)
    wait_for(args.join_after)
    torch.manual_seed(0)  # every group starts alike (checked); one joining later heals
    patience = args.timeout or (30 if args.face == "patient" else 10)  # an outage, a late group
    groups = ddpkit.ReplicaGroups(timeout=patience, min_groups=args.min_groups)
    model = ddpkit.prepare_model(Net(), args.strategy)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(48, 16, generator=generator)
    labels = torch.randint(0, 4, (48,), generator=generator)
    data = TensorDataset(inputs, labels, torch.arange(48))  # each sample carries its index
    batches = groups.batches(data, batch_size=4, seed=0)
    witness = Witness(groups, batches, args.drop_at, args.out + ".trained.jsonl", args.hold)
    if args.face == "trainer":  # the other face, a scheduler stepped per step, no pauses
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.7)
        trainer = ddpkit.Trainer(model, opt, training_step=lambda b: F.cross_entropy(
            model(b[0]), b[1]), scheduler=sched, callbacks=[witness],
            replica_groups=groups)  # fmt: skip
        wait_for(args.start_after)
        trainer.fit(batches, epochs=args.epochs)
        trained_epochs = trainer.epoch
    else:
        resumable = args.face == "resumable"  # checkpoints every 5 steps, and resumes
        state = {"model": model, "optimizer": opt, "batches": batches}
        loop = ddpkit.TrainLoop(state, args.out + ".ckpt" if resumable else None,
                                save_every_steps=5 if resumable else None,
                                callbacks=[witness], replica_groups=groups)  # fmt: skip
        wait_for(args.start_after)
        for _ in loop.epochs(args.epochs):
            for x, y, _index in loop.batches(batches):
                loop.backward(F.cross_entropy(model(x), y))
                loop.optimizer_step()
                time.sleep(0.1)
        trained_epochs = loop.run.epoch
    weights = strategy_of(model).full_state(model)  # a collective where it is sharded
    if ddpkit.get_rank() == 0:
        torch.save(weights, args.out)
        with open(args.out + ".json", "w") as record:
            json.dump({"epochs": trained_epochs}, record)


if __name__ == "__main__":
    main()
