"""What the step guard costs a training step, measured side by side in the same workers.

The guard (``ddpkit.train.guard``) checks each micro-batch's loss and, with a checkpoint_dir,
has the ranks compare stop requests about once a second, at a step boundary they agree on.
``nonfinite_loss="skip"`` instead exchanges every rank's loss check before each update: one
all-reduce per step that the step waits for. Separate runs of a job differ by more than
these costs on a shared machine, so each of 2 workers trains the same model epoch after
epoch, rotating between no guard, the default guard and the skip guard (each keeping its
own schedule from epoch to epoch): all three meet the same machine. Prints the median step
time of each and the ratios to no guard.

    .venv/bin/python benchmarks/guard_overhead.py --rounds 8
    .venv/bin/python benchmarks/guard_overhead.py --workload wine   # the smallest steps
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch
import torch.nn.functional as F
from parity import make_data, make_model

import ddpkit
from ddpkit.train.guard import StepGuard, Verdict


def workload(name: str) -> tuple[torch.nn.Module, Any, int]:
    """Model, dataset and per-worker batch for ``name``."""
    if name == "wine":  # the example's MLP on 4,096 synthetic 13-feature samples
        torch.manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(4096, 13), torch.randint(0, 3, (4096,)))
        return torch.nn.Sequential(torch.nn.Linear(13, 64), torch.nn.ReLU(),
                                   torch.nn.Linear(64, 3)), data, 32  # fmt: skip
    return make_model(name), make_data(name, 4096), 64


SETTINGS = ("off", "error", "skip")


def rotate(name: str, rounds: int) -> dict[str, list[float]]:
    """One worker: epochs under each guard setting in turn; step times per setting."""
    ddpkit.init(hang_timeout=0)
    torch.set_num_threads(1)
    module, data, batch = workload(name)
    model = ddpkit.prepare_model(module)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = ddpkit.prepare_loader(data, batch)
    times: dict[str, list[float]] = {setting: [] for setting in SETTINGS}
    # Each guard keeps its exchange schedule across its epochs. Its clock also runs during
    # the other settings' epochs, so it exchanges more often than in a real run: the cost
    # shown is an upper bound.
    guards = {"off": _NoGuard("error", exchange_stops=False),
              "error": StepGuard("error", exchange_stops=True),
              "skip": StepGuard("skip", exchange_stops=True)}  # fmt: skip
    for index in range(len(SETTINGS) * rounds + 1):
        setting = SETTINGS[index % len(SETTINGS)]
        trainer = ddpkit.Trainer(model, optimizer, F.cross_entropy)
        trainer.loop.guard = trainer.loop.updater.guard = guards[setting]  # the loop's part
        seconds = trainer.fit(loader, epochs=1)[0]["time_s"] / len(loader)
        if index > 0:  # the first epoch warms up
            times[setting].append(seconds)
    return times


class _NoGuard(StepGuard):
    """The guard switched off: no loss check, no exchange, nothing agreed."""

    def note_loss(self, loss: torch.Tensor) -> None:
        pass

    def check(self, collective: bool, stop_signal: int = 0) -> Verdict:
        return Verdict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="epochs per setting")
    parser.add_argument("--workload", default="mlp", choices=["mlp", "cnn", "wine"])
    args = parser.parse_args()
    times = ddpkit.spawn(rotate, 2, args.workload, args.rounds)[0]
    median = {setting: statistics.median(times[setting]) for setting in SETTINGS}
    print(f"\n{args.workload}, 2 workers, median of {args.rounds} rotating epochs:")
    print("  ".join(f"{s} {median[s] * 1e3:.3f} ms/step" for s in SETTINGS))
    ratios = ", ".join(f"{s}/off {median[s] / median['off']:.3f}" for s in SETTINGS[1:])
    print(f"ratios: {ratios}")


if __name__ == "__main__":
    main()
