"""One script, many ways to fail: ``ddpkit run --nproc 2 fail_as.py MODE`` (the failure table).

Rank 0 always goes on to a collective, so a failure on rank 1 leaves it waiting there.
"""

import os
import signal
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import ddpkit

MODE = sys.argv[1]
if MODE == "import":
    import tokenizers_that_are_not_installed  # noqa: F401  (a module-level ImportError)


def nan_on_rank_1(world: ddpkit.World) -> None:
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    model = ddpkit.prepare_model(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = {"n": 0}

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        value = F.cross_entropy(outputs, targets)
        return value * float("nan") if calls["n"] == 3 and world.rank == 1 else value

    trainer = ddpkit.Trainer(model, optimizer, loss)
    trainer.fit(ddpkit.prepare_loader(data, batch_size=4), epochs=1)


def main() -> None:
    world = ddpkit.init(timeout=60)
    if MODE == "every_rank":
        # Both out of init first: a rank still inside it when the other's error ends the job
        # fails as "a peer left while in init", which is what happened (seen under load).
        ddpkit.all_reduce_sum(1.0)
        raise ValueError("learning rate must be positive (got -0.1)")
    if MODE == "too_few_samples":
        ddpkit.prepare_loader(TensorDataset(torch.randn(1, 4)), batch_size=4)
    if MODE == "nan":
        nan_on_rank_1(world)
    if world.rank == 1:
        if MODE == "one_rank":
            raise ValueError("bad batch on rank 1")
        if MODE == "sys_exit":
            sys.exit(3)
        if MODE == "os_exit":
            os._exit(3)
        if MODE == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if MODE == "finished":
            return  # "only rank 0 evaluates": rank 1 leaves the script early
    ddpkit.all_reduce_sum(1.0)  # rank 0 waits here for rank 1


if __name__ == "__main__":
    main()
