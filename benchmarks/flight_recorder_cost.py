"""What arming torch's Flight Recorder costs a training step: the parity workload with it
armed (ddpkit's default) and disarmed (``DDPKIT_FLIGHT_RECORDER=0``), alternating.

The recorder is set when a process makes its first process group, so the two settings
cannot alternate inside one worker: each round launches the same 2-worker job once per
setting, in turn, and the fastest round of each is compared (the machine's noise only ever
adds time). Prints the step times and the ratio armed / disarmed.

    .venv/bin/python benchmarks/flight_recorder_cost.py --rounds 7
"""

from __future__ import annotations

import argparse
import os

import torch.distributed as dist
from parity import ddpkit_worker

import ddpkit
from ddpkit.flightrecorder.arming import FLIGHT_RECORDER_ENV


def recorded(cfg: dict[str, object]) -> tuple[float, int]:
    """One worker's median step time, and how many collectives its recorder holds."""
    seconds = ddpkit_worker(cfg, {}, "default")
    from ddpkit.flightrecorder.records import dump

    entries = len((dump() or {}).get("entries", []))
    dist.barrier()
    return seconds, entries


def run(cfg: dict[str, object], armed: bool) -> tuple[float, int]:
    os.environ[FLIGHT_RECORDER_ENV] = "1" if armed else "0"
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        os.environ.pop(name, None)
    return ddpkit.spawn(recorded, 2, cfg)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="launches per setting")
    parser.add_argument("--workload", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per launch")
    args = parser.parse_args()
    cfg = {"workload": args.workload, "threads": 1, "samples": 2048, "batch": 64,
           "epochs": args.epochs}  # fmt: skip
    times: dict[bool, list[float]] = {True: [], False: []}
    for index in range(2 * args.rounds):
        armed = index % 2 == 0
        seconds, entries = run(cfg, armed)
        assert (entries > 0) == armed, f"armed={armed} but the recorder holds {entries}"
        times[armed].append(seconds)
    for armed, label in ((True, "armed"), (False, "off")):
        print(f"{label}: " + ", ".join(f"{t * 1e3:.1f}" for t in times[armed]) + " ms/step")
    on, off = min(times[True]), min(times[False])
    print(f"\n{args.workload}, 2 workers, fastest of {args.rounds} launches per setting:")
    print(f"Flight Recorder off {off * 1e3:.2f} ms/step, armed {on * 1e3:.2f} ms/step: "
          f"ratio {on / off:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
