"""``ddpkit bench``: the tutorials' scaling table for any script: the same job at 1, 2, 4 workers.

Each world size runs the unchanged script: 1 worker as a plain process (no launcher, no DDP:
the baseline), N workers through ``ddpkit run``. Every worker gets the same number of CPU
threads at every size (``threads_per_worker``, by default the cores divided by the largest
size), so a worker is a fixed share of the machine, as a GPU is. The script reports its
set-up and per-epoch metrics through the Trainer (or :func:`ddpkit.reporting.report`), so no
log is scraped. Repeats are interleaved across sizes so drift hits every size alike; the
table shows medians. Speedup is the baseline's training time over this size's; efficiency
is speedup per added worker (speedup / workers for a 1-worker baseline).

Example:
    >>> efficiency(speedup=1.8, workers=2, baseline_workers=1)
    0.9
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ddpkit._core.log import command_logger
from ddpkit._core.protocol import CHECKPOINT_DIR_ENV, LOG_DIR_ENV, METRICS_ENV
from ddpkit._core.system import usable_cores
from ddpkit.errors import ConfigError, DdpkitError
from ddpkit.observe.benchreport import read_reports


@dataclass(frozen=True)
class BenchConfig:
    """What to benchmark and how.

    Example:
        >>> BenchConfig("train.py", workers=(1, 2)).threads(cores=4)
        2
    """

    script: str
    script_args: tuple[str, ...] = ()
    workers: tuple[int, ...] = (1, 2, 4)
    repeat: int = 1
    out: Path = Path("bench")
    threads_per_worker: int | None = None

    def threads(self, cores: int) -> int:
        """CPU threads each worker gets (OMP_NUM_THREADS).

        Example:
            >>> BenchConfig("t.py", workers=(1, 8)).threads(cores=2)
            1
        """
        return self.threads_per_worker or max(1, cores // max(self.workers))


@dataclass
class RunRecord:
    """One run of the script at one world size.

    Example:
        >>> RunRecord(2, 0, 10.0, [{"loss": 1.0, "time_s": 2.0, "samples": 100}]).train_s
        2.0
    """

    world_size: int
    repeat: int
    wall_s: float
    epochs: list[dict[str, Any]]
    setup: dict[str, Any] = field(default_factory=dict)

    @property
    def train_s(self) -> float:
        """Seconds spent in training epochs (what the Trainer timed)."""
        return float(sum(e["time_s"] for e in self.epochs))

    @property
    def samples_per_s(self) -> float:
        """Training samples per second over all workers."""
        return float(sum(e.get("samples", 0.0) for e in self.epochs)) / self.train_s


def run_bench(config: BenchConfig) -> dict[str, Any]:
    """Run every world size ``repeat`` times; return the summary (also written to ``out``).

    Example::

        run_bench(BenchConfig("examples/wine.py", ("--epochs", "2"), (1, 2)))
    """
    _check_config(config)
    cores = usable_cores()
    threads = config.threads(cores)
    warning = oversubscription_warning(config.workers, threads, cores, _gpu_count())
    if warning:
        command_logger("bench").warning(f"warning: {warning}")
    records = _run_all(config, threads)
    return {
        "script": config.script,
        "script_args": list(config.script_args),
        "threads_per_worker": threads,
        "cores": cores,
        "warning": warning,
        "rows": summarize(records),
        "runs": [_run_dict(r) for r in records],
    }


def _run_all(config: BenchConfig, threads: int) -> list[RunRecord]:
    records = []
    plan = [
        (size, r)
        for r in range(config.repeat)
        for size in (config.workers if r % 2 == 0 else config.workers[::-1])
    ]
    with tqdm(plan, desc="ddpkit bench", unit="run", disable=None) as bar:
        for size, repeat in bar:
            bar.set_postfix_str(f"{size} worker(s), repeat {repeat + 1}/{config.repeat}")
            record = run_once(config, size, repeat, threads)
            tqdm.write(
                f"ddpkit bench: {size} worker(s), repeat {repeat + 1}: train "
                f"{record.train_s:.2f} s, wall {record.wall_s:.2f} s, "
                f"final loss {record.epochs[-1]['loss']:.4f}"
            )
            records.append(record)
    return records


def run_once(config: BenchConfig, world_size: int, repeat: int, threads: int) -> RunRecord:
    """Run the script once at ``world_size``; its output goes to ``out/logs``.

    Example::

        run_once(config, 2, 0, threads=1).train_s   # 3.1
    """
    name = f"w{world_size}-r{repeat + 1}"
    metrics, log = config.out / "runs" / f"{name}.jsonl", config.out / "logs" / f"{name}.log"
    for path in (metrics, log):
        path.parent.mkdir(parents=True, exist_ok=True)
    metrics.unlink(missing_ok=True)
    checkpoints = config.out / "checkpoints" / name  # each run from scratch, never the user's
    curves = config.out / "explogs" / name  # nor the user's experiment logs
    for scratch in (checkpoints, curves):
        shutil.rmtree(scratch, ignore_errors=True)
    env = {
        **os.environ,
        METRICS_ENV: str(metrics.resolve()),
        "OMP_NUM_THREADS": str(threads),
        CHECKPOINT_DIR_ENV: str(checkpoints.resolve()),
        LOG_DIR_ENV: str(curves.resolve()),
    }
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as handle:
        done = subprocess.run(
            command_for(config, world_size), env=env, stdout=handle, stderr=subprocess.STDOUT
        )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise DdpkitError(
            f"the {world_size}-worker run exited with code {done.returncode}; its output "
            f"({log}) ends with:\n{_tail(log)}"
        )
    return _record_from(metrics, log, world_size, repeat, wall)


def command_for(config: BenchConfig, world_size: int) -> list[str]:
    """The command line of one run: the plain script at 1 worker, ``ddpkit run`` above.

    Example:
        >>> command_for(BenchConfig("t.py", ("--lr", "1")), 2)[1:]
        ['-m', 'ddpkit', 'run', '--nproc', '2', 't.py', '--lr', '1']
    """
    if world_size == 1:
        return [sys.executable, config.script, *config.script_args]
    launcher = [sys.executable, "-m", "ddpkit", "run", "--nproc", str(world_size)]
    return [*launcher, config.script, *config.script_args]


def _record_from(metrics: Path, log: Path, world_size: int, repeat: int, wall: float) -> RunRecord:
    reports = read_reports(metrics)
    epochs = [r for r in reports if r["kind"] == "epoch"]
    if not epochs:
        raise DdpkitError(
            f"the {world_size}-worker run reported no epoch metrics (see {log}): train with "
            "ddpkit.Trainer, or call ddpkit.reporting.report('epoch', epoch=..., loss=..., "
            "time_s=..., samples=...) once per epoch in your own loop"
        )
    setup = next((r for r in reports if r["kind"] == "setup"), {})
    return RunRecord(world_size, repeat, wall, epochs, setup)


def summarize(records: list[RunRecord]) -> list[dict[str, Any]]:
    """One row per world size: medians over repeats, speedup and efficiency.

    Example:
        >>> runs = [RunRecord(w, 0, 1.0, [{"loss": 1.0, "time_s": 8.0 / w, "samples": 64}])
        ...         for w in (1, 2)]
        >>> [(r["workers"], r["speedup"], r["efficiency"]) for r in summarize(runs)]
        [(1, 1.0, 1.0), (2, 2.0, 1.0)]
    """
    sizes = sorted({r.world_size for r in records})
    rows = [_row(size, [r for r in records if r.world_size == size]) for size in sizes]
    base = rows[0]
    for row in rows:
        row["speedup"] = round(base["train_s"] / row["train_s"], 4)
        row["efficiency"] = round(efficiency(row["speedup"], row["workers"], base["workers"]), 4)
    return rows


def _row(size: int, runs: list[RunRecord]) -> dict[str, Any]:
    last = runs[0].epochs[-1]
    setup = runs[0].setup
    return {
        "workers": size,
        "strategy": _strategy_text(setup),
        "global_batch": setup.get("global_batch"),
        "batch_policy": setup.get("batch_policy", "unknown"),
        "wall_s": statistics.median(r.wall_s for r in runs),
        "train_s": statistics.median(r.train_s for r in runs),
        "epoch_s": statistics.median(e["time_s"] for r in runs for e in r.epochs),
        "samples_per_s": statistics.median(r.samples_per_s for r in runs),
        "final_loss": last["loss"],
        "val_metric": _val_metric(last),
        "losses": [e["loss"] for e in runs[0].epochs],
        "step_ms": _phase_ms(runs),
        "peak_mem_mb": _median_of(runs, "mem/peak_mb"),
    }


def _strategy_text(setup: dict[str, Any]) -> str | None:
    """``"hsdp (2 replicas x 2 shards)"``: the strategy and how it arranged the ranks."""
    name, layout = setup.get("strategy"), setup.get("layout")
    return f"{name} ({layout})" if name and layout else name


PHASES = ("data", "compute", "sync", "optimizer", "other")  # ddpkit.observe.steptime's


def _phase_ms(runs: list[RunRecord]) -> dict[str, float] | None:
    """Milliseconds per step by phase: medians over the runs' epochs after the first (it
    warms up) when there are several; None when the runs did not report them."""
    phases = {name: _median_of(runs, f"time/{name}_ms") for name in PHASES}
    if any(value is None for value in phases.values()):
        return None
    return {name: float(value) for name, value in phases.items() if value is not None}


def _median_of(runs: list[RunRecord], key: str) -> float | None:
    values = [e[key] for r in runs for e in (r.epochs[1:] or r.epochs) if key in e]
    return statistics.median(values) if values else None


def efficiency(speedup: float, workers: int, baseline_workers: int) -> float:
    """Speedup per unit of added workers: 1.0 is perfect scaling.

    Example:
        >>> efficiency(3.0, 4, 1)
        0.75
    """
    return speedup * baseline_workers / workers


def oversubscription_warning(
    workers: tuple[int, ...], threads: int, cores: int, gpus: int
) -> str | None:
    """Why the largest size's figure is not a scaling figure, or None.

    Example:
        >>> print(oversubscription_warning((1, 2, 4), threads=1, cores=2, gpus=0))
        4 workers x 1 thread(s) need 4 cores and this machine has 2: the 4-worker figure ...
    """
    largest = max(workers)
    if gpus:
        if largest <= gpus:
            return None
        return f"{largest} workers share {gpus} GPU(s): the figure measures oversubscription"
    if largest * threads <= cores:
        return None
    return (
        f"{largest} workers x {threads} thread(s) need {largest * threads} cores and this "
        f"machine has {cores}: the {largest}-worker figure measures oversubscription, not scaling"
    )


def _val_metric(epoch: dict[str, Any]) -> dict[str, Any] | None:
    for name in ("val_accuracy", "val_loss", "accuracy"):
        if name in epoch:
            return {"name": name, "value": float(epoch[name])}
    return None


def _run_dict(record: RunRecord) -> dict[str, Any]:
    return {
        "workers": record.world_size,
        "repeat": record.repeat + 1,
        "wall_s": record.wall_s,
        "train_s": record.train_s,
        "setup": record.setup,
        "epochs": record.epochs,
    }


def _check_config(config: BenchConfig) -> None:
    if not Path(config.script).is_file():
        raise ConfigError(f"script {config.script} does not exist")
    if not config.workers or any(w < 1 for w in config.workers):
        raise ConfigError(f"--workers needs positive sizes like 1,2,4 (got {config.workers})")
    if config.repeat < 1:
        raise ConfigError(f"--repeat must be at least 1 (got {config.repeat})")


def _gpu_count() -> int:
    import torch  # the bench parent itself trains nothing: torch only for this question

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
