"""The checks that launch something: the smoke test, and a short run of the user's script.

Both go through the real launcher (``python -m ddpkit run --nproc N ...``) in a subprocess of
its own session, so a timeout stops the launcher and all its workers together. The short run
reports its set-up through ``DDPKIT_METRICS_FILE`` (see :mod:`ddpkit.observe.benchreport`) and stops
after ``DDPKIT_MAX_STEPS`` optimizer steps; while it goes, GPU utilization is sampled.

Example:
    >>> check_gpu_utilization([0.0, 0.0, 70.0, 80.0, 0.0], gpu_count=1, ran=True).detail
    'mean utilization 75% over 2 sample(s) while training (0.5 s apart)'
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ddpkit._core.protocol import (
    CHECKPOINT_DIR_ENV,
    LOG_DIR_ENV,
    MAX_STEPS_ENV,
    METRICS_ENV,
    SMOKE_OUT_ENV,
)
from ddpkit.launch.jobs import Outcome, ddpkit_run_command, run_command
from ddpkit.observe.benchreport import read_reports
from ddpkit.tools.doctor import smoke
from ddpkit.tools.doctor.preflight import FAIL, PASS, SKIP, WARN, Check, batch_advice

SAMPLE_EVERY_S = 0.5
LOW_UTILIZATION = 60.0  # percent; below it the GPUs mostly wait (the tutorial's threshold)


def run_smoke(nproc: int, timeout: float) -> tuple[Check, dict[str, Any] | None]:
    """Launch :mod:`ddpkit.tools.doctor.smoke` on ``nproc`` ranks; the check and rank 0's results.

    Example::

        run_smoke(2, 120)[0].status   # 'PASS'
    """
    with tempfile.TemporaryDirectory(prefix="ddpkit-smoke-") as folder:
        target = Path(folder) / "smoke.json"
        env = {SMOKE_OUT_ENV: str(target)}
        command = ddpkit_run_command(nproc, str(Path(smoke.__file__)), [])
        outcome = run_command(command, env, timeout)
        results = json.loads(target.read_text()) if target.is_file() else None
    failure = outcome.failure(f"`ddpkit run --nproc {nproc} smoke.py`")
    if failure is not None or results is None:
        detail = failure or "the smoke test wrote no results"
        return Check("smoke", FAIL, detail, _SMOKE_FIX), None
    return smoke_check(results), results


_SMOKE_FIX = (
    "read the launcher's error above; run the checks without --smoke first (backend, socket "
    "interfaces, hostname), and rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL for more"
)


def smoke_check(results: dict[str, Any]) -> Check:
    """PASS naming the ranks, backend and the largest size's bus bandwidth.

    Example:
        >>> smoke_check({"world_size": 2, "backend": "gloo", "results": [
        ...     {"bytes": 2**24, "busbw_gbps": 1.234}]}).detail
        'all_reduce correct on 2 ranks (gloo); 16 MiB at 1.23 GB/s bus bandwidth'
    """
    if results["world_size"] < 2:
        detail = f"all_reduce correct on 1 rank ({results['backend']}); no traffic to measure"
        return Check("smoke", PASS, detail)
    largest = max(results["results"], key=lambda row: row["bytes"])
    return Check(
        "smoke",
        PASS,
        f"all_reduce correct on {results['world_size']} ranks ({results['backend']}); "
        f"{smoke.size_text(largest['bytes'])} at {largest['busbw_gbps']:.2f} GB/s bus bandwidth",
    )


@dataclass(frozen=True)
class RunProbe:
    """A short run's outcome, its "setup" record, and the GPU utilization samples.

    Example:
        >>> RunProbe(Outcome(0, "", 1.0), None, []).setup is None
        True
    """

    outcome: Outcome
    setup: dict[str, Any] | None
    utilization: list[float]


def probe_env(folder: Path, steps: int) -> dict[str, str]:
    """What the short run is told: stop after ``steps`` optimizer steps, report its set-up
    to ``folder``, and keep its checkpoints and experiment logs there (the user's are left
    as they are).

    Example:
        >>> {CHECKPOINT_DIR_ENV, LOG_DIR_ENV} <= set(probe_env(Path("/tmp/d"), 20))
        True
    """
    return {
        METRICS_ENV: str(folder / "metrics.jsonl"),
        MAX_STEPS_ENV: str(steps),
        CHECKPOINT_DIR_ENV: str(folder / "checkpoints"),
        LOG_DIR_ENV: str(folder / "logs"),
    }


def probe_run(
    script: str, args: list[str], nproc: int, steps: int, timeout: float, gpu_count: int
) -> RunProbe:
    """Run the script briefly on ``nproc`` workers, sampling GPU utilization while it goes.

    Example::

        probe_run("examples/wine.py", ["--epochs", "2"], 2, 20, 120, 0).setup
        # {'kind': 'setup', 'world_size': 2, ...}
    """
    with tempfile.TemporaryDirectory(prefix="ddpkit-doctor-") as folder:
        env = probe_env(Path(folder), steps)
        with sample_utilization(gpu_count) as samples:
            outcome = run_command(ddpkit_run_command(nproc, script, args), env, timeout)
        setup = next((r for r in read_reports(env[METRICS_ENV]) if r.get("kind") == "setup"), None)
    return RunProbe(outcome, setup, samples)


def batch_check(probe: RunProbe, command: str) -> Check:
    """Check 10: the run's effective batch and LR advice, or FAIL with the run's output.

    Example:
        >>> batch_check(RunProbe(Outcome(1, "Traceback ...", 2.0), None, []), "t.py").status
        'FAIL'
    """
    failure = probe.outcome.failure(command)
    if failure is not None:
        return Check("batch and lr", FAIL, failure, "fix the script's error shown above")
    if probe.setup is None:
        return Check(
            "batch and lr",
            SKIP,
            "the run reported no set-up (it does not train with "
            "ddpkit.Trainer, nor call ddpkit.reporting.report('setup', ...))",
        )
    return batch_advice(probe.setup)


def check_gpu_utilization(samples: list[float], gpu_count: int, ran: bool) -> Check:
    """Check 9: mean GPU utilization while the short run trained; < 60% is a WARN.

    Samples before the first busy one and after the last are start-up and teardown, not
    training, and are left out.

    Example:
        >>> check_gpu_utilization([], gpu_count=0, ran=True).detail
        'no GPU'
    """
    if gpu_count == 0:
        return Check("gpu utilization", SKIP, "no GPU")
    if not ran:
        return Check("gpu utilization", SKIP, "needs --run SCRIPT (sampled while it trains)")
    busy = [i for i, value in enumerate(samples) if value > 0]
    if not busy:
        return Check("gpu utilization", SKIP, _NO_SAMPLES if not samples else "GPUs stayed idle")
    training = samples[busy[0] : busy[-1] + 1]
    mean = sum(training) / len(training)
    detail = (
        f"mean utilization {mean:.0f}% over {len(training)} sample(s) while training "
        f"({SAMPLE_EVERY_S:g} s apart)"
    )
    if mean >= LOW_UTILIZATION:
        return Check("gpu utilization", PASS, detail)
    return Check(
        "gpu utilization",
        WARN,
        f"{detail}, below {LOW_UTILIZATION:.0f}%: the GPUs wait",
        "raise the batch size or the DataLoader's num_workers (the tutorial's advice)",
    )


_NO_SAMPLES = "could not read utilization (torch.cuda.utilization needs pynvml; no nvidia-smi)"


@contextmanager
def sample_utilization(gpu_count: int) -> Iterator[list[float]]:
    """Mean utilization over the GPUs every 0.5 s while the block runs (nothing without GPUs).

    Example:
        >>> with sample_utilization(0) as samples:
        ...     pass
        >>> samples
        []
    """
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(SAMPLE_EVERY_S):
            value = gpu_utilization(gpu_count)
            if value is None:
                return
            samples.append(value)

    thread = threading.Thread(target=sample, name="ddpkit-gpu-sampler", daemon=True)
    if gpu_count:
        thread.start()
    try:
        yield samples
    finally:
        stop.set()
        if gpu_count:
            thread.join()


def gpu_utilization(gpu_count: int) -> float | None:
    """Mean utilization (percent) over the GPUs now: torch's NVML reading, else nvidia-smi.

    Example:
        >>> gpu_utilization(0) is None
        True
    """
    if gpu_count == 0:
        return None
    try:
        values = [float(torch.cuda.utilization(i)) for i in range(gpu_count)]
    except Exception:  # needs pynvml (or amdsmi); any failure means: ask nvidia-smi
        values = _nvidia_smi_utilization()
    return sum(values) / len(values) if values else None


def _nvidia_smi_utilization() -> list[float]:
    query = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=5, check=True)
        return [float(line) for line in done.stdout.split()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
