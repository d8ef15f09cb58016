"""What the step guard costs a training step: on and off alternately, in the same workers.

The guard (``ddpkit.guards``) checks each micro-batch's loss on the device and, before every
optimizer step, all-reduces ``world_size + 1`` floats so that every rank agrees on non-finite
losses and stop signals. Separate runs of a job differ by more than that on a shared
machine, so each of 2 workers trains the same model epoch after epoch with the guard on and
off in turn ("off" replaces the check by an empty verdict): both settings meet the same
machine. Prints the median step time of each and their ratio.

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
from ddpkit.guards import StepGuard, Verdict


def workload(name: str) -> tuple[torch.nn.Module, Any, int]:
    """Model, dataset and per-worker batch for ``name``."""
    if name == "wine":  # the example's MLP on 1,024 synthetic 13-feature samples
        torch.manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(1024, 13), torch.randint(0, 3, (1024,)))
        return torch.nn.Sequential(torch.nn.Linear(13, 64), torch.nn.ReLU(),
                                   torch.nn.Linear(64, 3)), data, 32  # fmt: skip
    return make_model(name), make_data(name, 4096), 64


def alternate(name: str, rounds: int) -> dict[str, list[float]]:
    """One worker: epochs with the guard on and off in turn; step times per setting."""
    ddpkit.init(hang_timeout=0)
    torch.set_num_threads(1)
    module, data, batch = workload(name)
    model = ddpkit.prepare_model(module)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = ddpkit.prepare_loader(data, batch)
    times: dict[str, list[float]] = {"on": [], "off": []}
    for index in range(2 * rounds + 1):
        setting = "on" if index % 2 else "off"
        trainer = ddpkit.Trainer(model, optimizer, F.cross_entropy)
        if setting == "off":
            trainer._guard = _NoGuard("error")
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
    times = ddpkit.spawn(alternate, 2, args.workload, args.rounds)[0]
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    print(f"\n{args.workload}, 2 workers, median of {args.rounds} alternating epochs:")
    print(f"guard off {off * 1e3:.3f} ms/step, on {on * 1e3:.3f} ms/step: ratio {on / off:.3f}")


if __name__ == "__main__":
    main()
