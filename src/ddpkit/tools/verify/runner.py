"""``ddpkit verify``: prove that N workers compute what one process computes, or say why not.

The unchanged script runs twice for K optimizer steps: as one process that reads, at each
step, exactly the samples the N ranks read together (the reference), and as N workers under
``ddpkit run``. Both record what they did through the Trainer (see
:mod:`ddpkit.tools.verify.recorder`); :mod:`ddpkit.tools.verify.report` compares the records and the
parameters. On a parameter mismatch with no cause in the records, the reference runs once
more: if it disagrees with itself, the script is not deterministic to begin with.

Example:
    $ ddpkit verify examples/wine.py --workers 2 --steps 10
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ddpkit._core.log import command_logger
from ddpkit._core.protocol import (
    CHECK_REPLICAS_ENV,
    CHECKPOINT_DIR_ENV,
    DEALING_ENV,
    KILL_AT_ENV,
    LOG_DIR_ENV,
    MAX_STEPS_ENV,
    REFERENCE_WORLD_ENV,
    SAVE_AT_STEP_ENV,
    VERIFY_DIR_ENV,
    WORKER_SETUP_ENV,
)
from ddpkit.errors import DdpkitError
from ddpkit.launch.jobs import Outcome, ddpkit_run_command, run_command
from ddpkit.launch.program import check_script
from ddpkit.tools.verify.groups import (
    group_env,
    groups_finding,
    killed_and_healed,
    lighthouse,
    merged_record,
    run_all,
)
from ddpkit.tools.verify.recorder import PARAMS_FILE, RECORD_FILE, SAMPLES_FOLDER
from ddpkit.tools.verify.report import (
    WORST_SHOWN,
    Finding,
    TensorDiff,
    compare_states,
    default_tolerances,
    explained,
    findings,
    likely_causes,
)

DEFAULT_STEPS = 10
RECORDER_SETUP = "ddpkit.tools.verify.recorder:install"
DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class VerifyConfig:
    """What to verify and how strictly (None tolerances: by the run's precision).

    Example:
        >>> VerifyConfig("train.py", workers=4).steps
        10
    """

    script: str
    script_args: tuple[str, ...] = ()
    workers: int = 2
    steps: int = DEFAULT_STEPS
    then: int | None = None  # resume the workers' run on this many halfway
    replica_groups: int | None = None  # a fault-tolerant run: this many groups of ``workers``
    kill_at: int | None = None  # and the last group's last rank killed (-9) after this step
    rtol: float | None = None
    atol: float | None = None
    check_every: int = 1
    out: Path | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class RunResult:
    """One run's record and model states (``initial``, ``final``)."""

    record: dict[str, Any]
    states: dict[str, dict[str, torch.Tensor]]


def verify(config: VerifyConfig) -> tuple[bool, str]:
    """Run both sides and judge; returns (passed, the report text).

    Example::

        verify(VerifyConfig("examples/wine.py"))
        # (True, 'ddpkit verify: examples/wine.py, 2 workers vs 1 process, ...')
    """
    check_script(config.script)
    with tempfile.TemporaryDirectory(prefix="ddpkit-verify-") as scratch:
        out = config.out or Path(scratch)
        if config.replica_groups:
            return judge(config, *run_fault_tolerant(config, out), out)
        reference = run_reference(config, out / "reference")
        if config.then is None:
            workers = run_side(config, out / f"workers{config.workers}", workers=config.workers)
        else:
            workers = run_resized(config, out)
        return judge(config, reference, workers, out)


def run_resized(config: VerifyConfig, out: Path) -> RunResult:
    """N workers for half the steps, checkpointing at the end; then M workers resume from
    that checkpoint to the last step, as an elastic job does when its world changes. One
    record of both, as if a single run: its start from the first, its end from the second.

    Example::

        run_resized(VerifyConfig("examples/wine.py", workers=2, then=3), Path("/tmp/v"))
    """
    assert config.then is not None
    half, folder = max(1, config.steps // 2), out / f"workers{config.workers}-then{config.then}"
    first = run_side(config, folder / "first", config.workers, steps=half, save_at=half)
    _check_resizable(config, first, folder / "first" / "checkpoints")
    second = run_side(config, folder / "second", config.then, checkpoints=folder / "first")
    ends = {"initial": first.states["initial"], "final": second.states["final"]}
    return RunResult(merge_records(first.record, second.record), ends)


def run_reference(config: VerifyConfig, folder: Path, env: dict[str, str] | None = None
                  ) -> RunResult:  # fmt: skip
    """The single process standing in for the workers (of a fault-tolerant run: one replica
    group alone, at a lighthouse of its own).

    Example::

        run_reference(VerifyConfig("examples/wine.py"), Path("/tmp/v/reference"))
    """
    if not config.replica_groups:
        return run_side(config, folder, 1, reference=True)
    with lighthouse(1) as address:
        extra = {**group_env(0, address), **(env or {})}
        return run_side(config, folder, 1, reference=True, extra_env=extra)


def run_fault_tolerant(config: VerifyConfig, out: Path) -> tuple[RunResult, RunResult]:
    """The single process as one replica group alone, then G groups of N workers at once,
    each at a lighthouse of verify's own (:mod:`ddpkit.tools.verify.groups`).

    Example::

        reference, groups = run_fault_tolerant(VerifyConfig("ft.py", 1, replica_groups=2), out)
    """
    assert config.replica_groups is not None
    reference = None if config.kill_at else run_reference(config, out / "reference")
    doomed = config.replica_groups - 1 if config.kill_at else None  # the last group
    killing = {KILL_AT_ENV: str(config.kill_at)}
    with lighthouse(config.replica_groups) as address:
        results = run_all(lambda g: run_side(
            config, out / f"group{g}", config.workers, restarts=int(g == doomed),
            extra_env={**group_env(g, address), **(killing if g == doomed else {})},
        ), config.replica_groups)  # fmt: skip
    finals = [result.states["final"] for result in results]
    record = merged_record([result.record for result in results], finals)
    if reference is None:  # after a failure: one process trains what each step trained
        dealing = ",".join(map(str, results[0].record.get("dealing", [])))
        reference = run_reference(config, out / "reference", {DEALING_ENV: dealing})
    if doomed is not None:
        record["killed"] = killed_and_healed(out / f"group{doomed}" / "output.log", doomed,
                                             config.kill_at or 0)  # fmt: skip
    return reference, RunResult(record, results[0].states)


def merge_records(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """One record of a run done in two parts (``first`` up to its checkpoint, then
    ``second`` from it): the set-up and the start of the first, the steps of the second,
    every sample and replica check of both.

    Example:
        >>> def part(steps, index):
        ...     return {"steps": steps, "samples": {index: [1, 2]},
        ...             "replicas": {"checked": [steps], "divergence": None}}
        >>> merged = merge_records(part(5, "1"), part(10, "7"))
        >>> merged["steps"], sorted(merged["samples"]), merged["replicas"]["checked"]
        (10, ['1', '7'], [5, 10])
    """
    checked = first["replicas"]["checked"] + second["replicas"]["checked"]
    divergence = first["replicas"]["divergence"] or second["replicas"]["divergence"]
    padding = second.get("setup", {}).get("padding")
    new_padding = padding if padding != first.get("setup", {}).get("padding") else None
    samples = {**first["samples"], **second["samples"]}
    resized = {"world_size": second.get("world_size"), "padding": new_padding}
    return {**first, "steps": second["steps"], "samples": samples, "resized": resized,
            "replicas": {"checked": checked, "divergence": divergence}}  # fmt: skip


def _check_resizable(config: VerifyConfig, first: RunResult, checkpoints: Path) -> None:
    """The first part left a checkpoint to resume, with a global batch the second keeps."""
    if not any(checkpoints.rglob("epoch_*")):
        raise DdpkitError(
            f"verify --then {config.then} resumes the {config.workers}-worker run from its "
            "checkpoint, and it wrote none: give the script's Trainer (or TrainLoop) a "
            "checkpoint_dir (examples/wine.py: --checkpoint-dir DIR; verify keeps it in its "
            "scratch folder)"
        )
    policy = first.record["setup"].get("batch_policy", "per_device")
    if policy != "global" and config.then != config.workers:
        raise DdpkitError(
            f"verify --then {config.then}: the script's batch_policy is {policy!r}, so its "
            f"global batch changes from {config.workers} to {config.then} workers and cannot "
            "match one process; pass batch_policy='global' to prepare_loader (wine.py: "
            "--batch-policy global)"
        )


def judge(config: VerifyConfig, ref: RunResult, run: RunResult, out: Path) -> tuple[bool, str]:
    """Compare the runs; on an unexplained mismatch, rerun the reference to test determinism.

    Example::

        judge(config, reference, workers, Path("/tmp/v"))
    """
    precision = run.record["setup"].get("precision", "fp32")
    rtol, atol = _tolerances(config, precision)
    final = compare_states(run.states["final"], ref.states["final"], rtol, atol)
    initial = compare_states(run.states["initial"], ref.states["initial"], rtol, atol)
    checks = findings(run.record, ref.record, initial, final, f"rtol {rtol:g} + atol {atol:g}")
    if "groups" in run.record:
        checks.append(groups_finding(run.record))
    if "killed" in run.record:
        checks.append(Finding("killed", *run.record["killed"]))
    passed = all(check.ok for check in checks)
    causes = likely_causes(run.record, ref.record, initial, None) if not passed else []
    if not passed and not explained(causes):
        again = run_reference(config, out / "reference-again")
        rerun = compare_states(again.states["final"], ref.states["final"], 0.0, 0.0)
        causes = likely_causes(run.record, ref.record, initial, max(d.max_abs for d in rerun))
    return passed, _report(config, run, checks, final, causes, passed)


def run_side(
    config: VerifyConfig,
    folder: Path,
    workers: int,
    *,
    reference: bool = False,
    steps: int | None = None,
    save_at: int | None = None,
    checkpoints: Path | None = None,
    extra_env: dict[str, str] | None = None,
    restarts: int = 0,
) -> RunResult:
    """One side: the single-process ``reference`` or ``workers`` workers; its record, or a
    clear error.
    ``steps`` (default: the config's), a checkpoint after step ``save_at``, and the folder
    whose checkpoints it resumes from (default: its own, empty) serve ``--then``;
    ``extra_env`` and ``restarts`` (torch's agent restarting the workers), ``--replica-groups``.

    Example::

        run_side(config, Path("/tmp/v/reference"), 1, reference=True).record["steps"]   # 10
    """
    folder.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder / SAMPLES_FOLDER, ignore_errors=True)  # an earlier --out run's
    steps = steps or config.steps
    env = {
        VERIFY_DIR_ENV: str(folder.resolve()),
        CHECKPOINT_DIR_ENV: str(((checkpoints or folder) / "checkpoints").resolve()),
        LOG_DIR_ENV: str((folder / "logs").resolve()),  # nor the user's curves
        MAX_STEPS_ENV: str(steps),
        WORKER_SETUP_ENV: RECORDER_SETUP,  # every worker records through a callback
        **({SAVE_AT_STEP_ENV: str(save_at)} if save_at else {}),
        **(extra_env or {}),
    }
    if reference:  # one process standing in for the N workers (of every replica group)
        env[REFERENCE_WORLD_ENV] = str(config.workers * (config.replica_groups or 1))
        command = [sys.executable, "-m", "ddpkit.launch.worker", config.script]
        command += config.script_args
    else:
        env[CHECK_REPLICAS_ENV] = str(config.check_every)
        command = ddpkit_run_command(workers, config.script, list(config.script_args),
                                     restarts=restarts)  # fmt: skip
    name = "the single-process reference" if reference else f"the {workers}-worker run"
    command_logger("verify").info(f"running {name} ({steps} steps)...")
    outcome = run_command(command, env, config.timeout_s)
    (folder / "output.log").write_text(outcome.output)
    return _load(folder, outcome, name)


def _load(folder: Path, outcome: Outcome, name: str) -> RunResult:
    failure = outcome.failure(name)
    if failure is not None:
        raise DdpkitError(failure)
    if not (folder / RECORD_FILE).is_file():
        raise DdpkitError(
            f"{name} finished but recorded nothing: verify follows training through "
            "ddpkit.Trainer, or a loop of your own through ddpkit.TrainLoop (its epochs(), "
            "batches() and optimizer_step() tell verify where the steps are), with "
            "ddpkit.prepare_model and prepare_loader"
        )
    record = json.loads((folder / RECORD_FILE).read_text())
    states = torch.load(folder / PARAMS_FILE, map_location="cpu", weights_only=True)
    return RunResult(record, states)


def _tolerances(config: VerifyConfig, precision: str) -> tuple[float, float]:
    rtol, atol = default_tolerances(precision)
    return (
        config.rtol if config.rtol is not None else rtol,
        config.atol if config.atol is not None else atol,
    )


def _report(
    config: VerifyConfig,
    run: RunResult,
    checks: list[Finding],
    final: list[TensorDiff],
    causes: list[str],
    passed: bool,
) -> str:
    lines = [
        f"ddpkit verify: {config.script}, {_workers_text(config)} vs 1 process, "
        f"{config.steps} optimizer steps"
    ]
    lines += [f"  {'ok  ' if c.ok else 'FAIL'}  {c.name:<15} {c.text}" for c in checks]
    if passed:
        lines.append(f"PASS: {_workers_text(config)} computed what one process computes")
        return "\n".join(lines)
    bad = [d for d in final if not d.ok]
    if bad:
        lines += ["worst tensors after the last step:", *(d.row() for d in bad[:WORST_SHOWN])]
    lines.append("FAIL: likely causes, most specific first:" if causes else "FAIL")
    for number, cause in enumerate(causes, 1):
        lines.append(
            textwrap.fill(cause, 100, initial_indent=f"  {number}. ", subsequent_indent="     ")
        )
    if not causes:
        lines.append("  no known cause: rerun with --steps 1 to see whether it starts at once")
    return "\n".join(lines)


def _workers_text(config: VerifyConfig) -> str:
    workers = f"{config.workers} worker{'s' if config.workers > 1 else ''}"
    if config.replica_groups:
        killed = f", one process killed after step {config.kill_at}" if config.kill_at else ""
        return f"{config.replica_groups} replica groups of {workers}{killed}"
    if config.then is None:
        return workers
    return f"{workers} then {config.then} from step {max(1, config.steps // 2)}"
