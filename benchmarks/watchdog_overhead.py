"""What the hang watchdog costs a training step: on and off alternately, in the same workers.

Separate runs of the same job differ by 20% on a shared machine, far more than the cost
being measured, so each of 2 workers trains the same model epoch after epoch, switching the
watchdog on and off between epochs (the thread stopped and started again, not just idle):
both settings meet the same machine. Prints the median step time of each and their ratio.

    .venv/bin/python benchmarks/watchdog_overhead.py --rounds 8
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F
from parity import make_data, make_model

import ddpkit
from ddpkit.runtime.watchdog import DEFAULT_HANG_TIMEOUT_S, start_watchdog, stop_watchdog


def alternate(workload: str, rounds: int, batch: int) -> dict[str, list[float]]:
    """One worker: epochs with the watchdog on and off in turn; step times per setting."""
    world = ddpkit.init(hang_timeout=0)
    torch.set_num_threads(1)
    model = ddpkit.prepare_model(make_model(workload))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = ddpkit.prepare_loader(make_data(workload, 4096), batch)
    store = dist.distributed_c10d._get_default_store()  # what init gives the watchdog
    times: dict[str, list[float]] = {"on": [], "off": []}
    for index in range(2 * rounds + 1):
        setting = "on" if index % 2 else "off"
        if setting == "on":
            start_watchdog(DEFAULT_HANG_TIMEOUT_S, world.rank, world.world_size, store)
        trainer = ddpkit.Trainer(model, optimizer, F.cross_entropy)  # sees this watchdog
        seconds = trainer.fit(loader, epochs=1)[0]["time_s"] / len(loader)
        stop_watchdog()
        if index > 0:  # the first epoch warms up
            times[setting].append(seconds)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="epochs per setting")
    parser.add_argument("--workload", default="mlp", choices=["mlp", "cnn"])
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    times = ddpkit.spawn(alternate, 2, args.workload, args.rounds, args.batch)[0]
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    print(f"\n{args.workload}, 2 workers, median of {args.rounds} alternating epochs:")
    print(f"watchdog off {off * 1e3:.2f} ms/step, on {on * 1e3:.2f} ms/step: ratio {on / off:.3f}")


if __name__ == "__main__":
    main()
