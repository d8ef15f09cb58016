"""What a console must show live and in order: ``ddpkit run --nproc 2 live_output.py MODE``.

``user``: a warning every rank prints right after ``ddpkit.init()`` (rank 0 logged its
start-up line before it); rank 0 writes A to stdout, B to stderr, C to stdout, 20 ms apart;
then draws its own tqdm bar (``disable=rank != 0``, the common habit), 16 steps of 0.25 s,
and says when the bar was done.
``trainer``: ddpkit's own bar, a Trainer over 16 batches of 0.25 s.
"""

import sys
import time
import warnings

import torch
from tqdm import tqdm

import ddpkit

STEPS, STEP_S = 16, 0.25


def user_bar(rank: int) -> None:
    warnings.warn("every rank warns after init", UserWarning, stacklevel=1)
    if rank == 0:
        for letter, stream in (("A", sys.stdout), ("B", sys.stderr), ("C", sys.stdout)):
            print(f"ORDER {letter}", file=stream, flush=True)
            time.sleep(0.02)
        for _ in tqdm(range(STEPS), desc="user bar", disable=rank != 0):
            time.sleep(STEP_S)
        print(f"BAR DONE {time.time():.3f}", flush=True)


def trainer_bar() -> None:
    model = ddpkit.prepare_model(torch.nn.Linear(2, 1))
    data = torch.utils.data.TensorDataset(torch.ones(STEPS * 2, 2), torch.zeros(STEPS * 2, 1))

    def slow_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        time.sleep(STEP_S)
        return torch.nn.functional.mse_loss(output, target)

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ddpkit.Trainer(model, opt, loss_fn=slow_loss).fit(
        ddpkit.prepare_loader(data, batch_size=1), epochs=1
    )
    if ddpkit.is_main():
        print(f"BAR DONE {time.time():.3f}", flush=True)


world = ddpkit.init(hang_timeout=0)
user_bar(world.rank) if sys.argv[1] == "user" else trainer_bar()
ddpkit.barrier()
