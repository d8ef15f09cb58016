"""One replica group of a fault-tolerant job (FaultTolerantStrategy), as ``ddpkit run``
starts it: ``DDPKIT_FT_GROUP`` names the group, ``TORCHFT_LIGHTHOUSE`` the lighthouse.

``python replica_group.py OUT EPOCHS [trainer|patient|resumable]``: trains a small model
with TrainLoop on 48 samples in batches of 4, dealt among the groups alive at each step
(ReplicaBatches), with a pause a step so that a test can kill it mid-run; prints ``step N``
after each step, and writes the final weights to OUT and the batches each committed step
trained (the ledger's record) to OUT.json.
With ``trainer``: the same through ``Trainer.fit``, without the pause; with ``patient``: an
exchange or quorum may take 30 s, not 10; with ``resumable``: a checkpoint every 5 steps in
OUT.ckpt, resumed from when started again.
"""

import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import ddpkit
from ddpkit.parallel.faulttolerant import FaultTolerantStrategy
from ddpkit.parallel.replicabatches import ReplicaBatches


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner, self.outer = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(torch.relu(self.inner(x)))


def main() -> None:
    out, epochs = sys.argv[1], int(sys.argv[2])
    ddpkit.init(hang_timeout=0)
    torch.manual_seed(0)  # every group starts alike (checked); one joining later heals
    patience = 30 if sys.argv[3:] == ["patient"] else 10  # a lighthouse outage to ride out
    model = ddpkit.prepare_model(Net(), FaultTolerantStrategy(timeout_s=patience))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(48, 16, generator=generator),
                         torch.randint(0, 4, (48,), generator=generator))  # fmt: skip
    batches = ReplicaBatches(model, data, batch_size=4, seed=0)
    if sys.argv[3:] == ["trainer"]:  # the other face, without pauses
        trainer = ddpkit.Trainer(model, opt, F.cross_entropy)
        trainer.fit(batches, epochs=epochs)
        trained_epochs = trainer.epoch
    else:
        resumable = sys.argv[3:] == ["resumable"]  # checkpoints every 5 steps, and resumes
        state = {"model": model, "optimizer": opt, "batches": batches}
        loop = ddpkit.TrainLoop(state, out + ".ckpt" if resumable else None,
                                save_every_steps=5 if resumable else None)  # fmt: skip
        for _ in loop.epochs(epochs):
            for x, y in loop.batches(batches):
                loop.backward(F.cross_entropy(model(x), y))
                loop.optimizer_step()
                print(f"step {loop.run.step}", flush=True)
                time.sleep(0.1)
        trained_epochs = loop.run.epoch
    torch.save(ddpkit.unwrap_model(model).state_dict(), out)
    with open(out + ".json", "w") as record:
        json.dump({"record": batches.record, "epochs": trained_epochs}, record)


if __name__ == "__main__":
    main()
