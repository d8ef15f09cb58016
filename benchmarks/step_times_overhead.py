"""What the step-time breakdown costs a training step, measured side by side in the same workers.

The breakdown (``ddpkit.observe.steptime``) is always on: a clock read at each move of a step,
one gradient hook, and every 50 steps and at each epoch's end one all-gather of 8 numbers
per rank plus the memory peak read. Separate runs differ by more than that on a shared
machine, so each of 2 workers trains the parity benchmark's model (benchmarks/parity.py)
epoch after epoch, alternating between the breakdown on and off (each epoch a fresh Trainer,
so each "on" epoch also finds its last gradient again: an upper bound). Prints the fastest
and the median epoch's step time of each and their ratios, on/off.

    .venv/bin/python benchmarks/step_times_overhead.py --rounds 10
    .venv/bin/python benchmarks/step_times_overhead.py --workload cnn
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from parity import make_data, make_model

import ddpkit

SETTINGS = ("off", "on")


def alternate(workload: str, rounds: int, samples: int) -> dict[str, list[float]]:
    """One worker: epochs with the breakdown off and on in turn; seconds per step of each."""
    ddpkit.init(hang_timeout=0)
    torch.set_num_threads(1)
    model = ddpkit.prepare_model(make_model(workload))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = ddpkit.prepare_loader(make_data(workload, samples), 64)
    times: dict[str, list[float]] = {setting: [] for setting in SETTINGS}
    for index in range(len(SETTINGS) * rounds + 1):
        setting = SETTINGS[index % len(SETTINGS)]
        trainer = ddpkit.Trainer(model, optimizer, F.cross_entropy)
        trainer.loop.clock.enabled = setting == "on"
        seconds = trainer.fit(loader, epochs=1)[0]["time_s"] / len(loader)
        if index > 0:  # the first epoch warms up
            times[setting].append(seconds)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="epochs per setting")
    parser.add_argument("--workload", default="mlp", choices=["mlp", "cnn"])
    parser.add_argument("--samples", type=int, default=4096, help="per epoch, all workers")
    args = parser.parse_args()
    times = ddpkit.spawn(alternate, 2, args.workload, args.rounds, args.samples)[0]
    fastest = {setting: min(times[setting]) for setting in SETTINGS}
    median = {setting: statistics.median(times[setting]) for setting in SETTINGS}
    print(f"\n{args.workload}, 2 workers, {args.rounds} alternating epochs per setting:")
    for setting in SETTINGS:
        print(f"  breakdown {setting:3}  fastest {fastest[setting] * 1e3:.3f} ms/step  "
              f"median {median[setting] * 1e3:.3f} ms/step")  # fmt: skip
    print(f"ratio on/off: fastest {fastest['on'] / fastest['off']:.3f}  "
          f"median {median['on'] / median['off']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
