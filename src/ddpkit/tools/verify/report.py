"""``ddpkit verify``'s judgement: the two runs' records compared, and the likely causes named.

The checks, each ok or not: both runs made the same number of optimizer steps on the same
global batch; the sampler showed every sample once per epoch; the replicas stayed identical;
every tensor of the model after the last step is within tolerance of the single process's
(``|a - b| <= atol + rtol * |b|`` element-wise, as ``torch.allclose``). The tolerances allow
for the only difference a correct run has: N partial gradient sums added in another order.

When a check fails, the records point at the cause: ranks whose random generators differed
when the model was built, samples whose fingerprints differ from the single process's
(data that depends on the rank), weights that already differed before the first step,
BatchNorm without synchronization, Dropout masks drawn per rank, reduced precision, or a
single process that does not even agree with itself (a non-deterministic op).

Example:
    >>> default_tolerances("fp32")
    (0.0001, 1e-06)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ddpkit._core.text import ranks_text
from ddpkit.data.coverage import describe_coverage

Record = dict[str, Any]
State = dict[str, torch.Tensor]
WORST_SHOWN = 6  # tensors listed when the final states differ


@dataclass(frozen=True)
class TensorDiff:
    """How far one tensor of the N-worker run is from the single process's.

    Example:
        >>> TensorDiff("0.weight", 1e-3, 1e-2, False, (4, 2)).row()
        '  0.weight                         max abs 1.00e-03  rel 1.00e-02  shape [4, 2]'
    """

    name: str
    max_abs: float
    max_rel: float  # max abs difference over the reference tensor's largest magnitude
    ok: bool
    shape: tuple[int, ...]

    def row(self) -> str:
        """One line of the worst-tensors table."""
        shape = ", ".join(map(str, self.shape))
        return (
            f"  {self.name:<32} max abs {self.max_abs:.2e}  rel {self.max_rel:.2e}  shape [{shape}]"
        )


@dataclass(frozen=True)
class Finding:
    """One check's line: its name, whether it passed, and what was seen."""

    name: str
    ok: bool
    text: str


def default_tolerances(precision: str) -> tuple[float, float]:
    """(rtol, atol) for a run's precision: fp32 is tight, bf16/fp16 round at every step.

    Example:
        >>> default_tolerances("bf16")
        (0.02, 0.001)
    """
    return (1e-4, 1e-6) if precision == "fp32" else (2e-2, 1e-3)


def compare_states(run: State, reference: State, rtol: float, atol: float) -> list[TensorDiff]:
    """Every tensor's distance, worst first (a missing or reshaped tensor counts as failed).

    Example:
        >>> a = {"w": torch.tensor([1.0, 2.0])}
        >>> compare_states(a, {"w": torch.tensor([1.0, 2.5])}, 1e-4, 1e-6)[0].max_abs
        0.5
    """
    diffs = [_diff(name, run.get(name), tensor, rtol, atol) for name, tensor in reference.items()]
    return sorted(diffs, key=lambda d: (d.ok, -d.max_rel))


def _diff(
    name: str, run: torch.Tensor | None, ref: torch.Tensor, rtol: float, atol: float
) -> TensorDiff:
    if run is None or run.shape != ref.shape:
        return TensorDiff(name, float("inf"), float("inf"), False, tuple(ref.shape))
    a, b = run.double(), ref.double()
    gap = (a - b).abs()
    max_abs = float(gap.max()) if gap.numel() else 0.0
    scale = float(b.abs().max()) if b.numel() else 0.0
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    ok = bool(torch.allclose(a, b, rtol=rtol, atol=atol))
    return TensorDiff(name, max_abs, rel, ok, tuple(ref.shape))


def findings(
    run: Record, ref: Record, initial: list[TensorDiff], final: list[TensorDiff], tolerances: str
) -> list[Finding]:
    """The checks, in the order they are printed.

    Example::

        findings(run_record, ref_record, initial, final, "rtol 1e-4")
    """
    return [
        _steps_finding(run, ref),
        _batch_finding(run, ref),
        _coverage_finding(run),
        _data_finding(run, ref),
        _replica_finding(run),
        _start_finding(initial),
        _final_finding(run, final, tolerances),
    ]


def _final_finding(run: Record, final: list[TensorDiff], tolerances: str) -> Finding:
    bad = [d for d in final if not d.ok]
    worst = final[0] if final else None
    params = f"{len(final)} tensors within {tolerances}" if not bad else (
        f"{len(bad)} of {len(final)} tensors differ beyond {tolerances}")  # fmt: skip
    if worst is not None:
        params += f"; worst {worst.name}: max abs {worst.max_abs:.1e}, rel {worst.max_rel:.1e}"
    return Finding(f"after {run['steps']} steps", not bad and bool(final), params)


def _start_finding(initial: list[TensorDiff]) -> Finding:
    bad = [d.name for d in initial if not d.ok]
    if not bad:
        return Finding("start", True, f"{len(initial)} tensors identical before the first step")
    shown = ", ".join(bad[:4])
    return Finding("start", False, f"{len(bad)} tensors differ before the first step: {shown}")


def _sample_differences(run: Record, ref: Record) -> tuple[list[str], list[str]]:
    """Dataset indices both runs fingerprinted, and those whose fingerprints differ."""
    mine, theirs = run.get("samples", {}), ref.get("samples", {})
    common = [index for index in mine if index in theirs]
    return common, [index for index in common if mine[index] != theirs[index]]


def _data_finding(run: Record, ref: Record) -> Finding:
    common, differ = _sample_differences(run, ref)
    if not common:
        return Finding("data", True, "not compared (the sampler's order is not reproducible)")
    if differ:
        return Finding("data", False, f"{len(differ)} of {len(common)} samples differ by index")
    return Finding("data", True, f"{len(common)} samples trained on, identical in both runs")


def likely_causes(
    run: Record, ref: Record, initial: list[TensorDiff], reruns_differ: float | None
) -> list[str]:
    """What would explain a failure, most specific first; empty when nothing is known.

    Example::

        likely_causes(run_record, reference_record, initial_diffs, None)
        # ['per-rank randomness: ...']
    """
    causes = [
        _resized_padding(run),
        _per_rank_rng(run),
        _not_data_parallel(run),
        _data_differs(run, ref),
        _unsharded(run),
        _other_batch(run, ref),
        _initial_differs(initial),
        _batchnorm(run),
        _dropout(run),
        _precision(run),
        _nondeterministic(reruns_differ),
    ]
    return [cause for cause in causes if cause]


def _resized_padding(run: Record) -> str | None:
    resized = run.get("resized") or {}
    if not resized.get("padding"):
        return None
    return (
        f"the sampler of the {resized['world_size']} workers after the resize evens out its "
        f"shards ({resized['padding']}), which the {run['world_size']} workers and the "
        "single process do not: the epochs after it train on other samples. Resize to a "
        "world size the dataset divides by, or drop the remainder in both "
        '(prepare_loader(..., uneven="drop") with a dataset size both divide)'
    )


def explained(causes: list[str]) -> bool:
    """True when a cause other than the known by-design differences was found.

    Example:
        >>> explained(["unsynchronized BatchNorm: ..."])
        False
    """
    by_design = ("unsynchronized BatchNorm", "Dropout", "reduced precision")
    return any(not cause.startswith(by_design) for cause in causes)


def _steps_finding(run: Record, ref: Record) -> Finding:
    same = run["steps"] == ref["steps"]
    text = f"{run['steps']} optimizer steps in both runs" if same else (
        f"the {run['world_size']} workers made {run['steps']} optimizer steps and the single "
        f"process {ref['steps']}: they did not see the same number of batches")  # fmt: skip
    return Finding("steps", same, text)


def _batch_finding(run: Record, ref: Record) -> Finding:
    mine, theirs = run["setup"].get("global_batch"), ref["setup"].get("global_batch")
    if mine == theirs and mine is not None:
        per_device = run["setup"].get("per_device_batch")
        return Finding("global batch", True, f"{mine} in both ({per_device} per device)")
    return Finding(
        "global batch", False,
        f"{mine} with {run['world_size']} workers but {theirs} in the single process: verify "
        "gives the single process the workers' global batch through ddpkit.prepare_loader "
        "(a loader built by hand keeps its own batch size); use prepare_loader, or "
        "batch_policy='global' so the global batch does not depend on the world size",
    )  # fmt: skip


def _coverage_finding(run: Record) -> Finding:
    coverage = run.get("coverage")
    if coverage is None:
        return Finding("sampler", False, "no epoch started: nothing was trained")
    ok = coverage.get("verdict") != "bad"
    text = describe_coverage(coverage)
    if not ok:
        text += (
            ". Every sample should be seen once per epoch across the ranks: shard with "
            "ddpkit.prepare_loader (or DistributedSampler with this rank and world size, the "
            "same seed everywhere, and set_epoch each epoch)"
        )
    return Finding("sampler", ok, text)


def _replica_finding(run: Record) -> Finding:
    replicas = run["replicas"]
    checked, divergence = replicas["checked"], replicas["divergence"]
    if divergence is not None:
        tensors = ", ".join(divergence["tensors"][:5])
        ranks = divergence["ranks"]
        verb = "differs" if len(ranks) == 1 else "differ"
        return Finding(
            "replicas", False,
            f"{ranks_text(ranks)} {verb} from rank 0 after step {divergence['step']} "
            f"in {tensors}: the ranks train different models",
        )  # fmt: skip
    if not checked:
        return Finding("replicas", True, "not checked (one rank, or FSDP shards the weights)")
    return Finding(
        "replicas",
        True,
        f"identical on {run['world_size']} rank{'s' if run['world_size'] != 1 else ''} "
        f"at {len(checked)} checks",
    )


def _per_rank_rng(run: Record) -> str | None:
    rng, weights = run["build"].get("rng", []), run["build"].get("weights", [])
    if len(set(rng)) <= 1 and len(set(weights)) <= 1:
        return None
    what = "random generators" if len(set(rng)) > 1 else "weights"
    return (
        f"per-rank randomness: the ranks' {what} differed when prepare_model was called "
        f"({_groups(rng if len(set(rng)) > 1 else weights)}), so anything drawn before it "
        "(data, initial weights) differs per rank; DDP then copied rank 0's weights, which "
        "hides the difference in the model but not in the data. Fix: seed once with the same "
        "value on every rank, ddpkit.init(seed=S) or torch.manual_seed(S), never with the rank"
    )


def _not_data_parallel(run: Record) -> str | None:
    divergence = run["replicas"]["divergence"]
    if divergence is None:
        return None
    if run["setup"].get("strategy") == "none":
        return (
            "no gradient averaging: the model was prepared with strategy='none', so every rank "
            "trains its own copy on its own shard; use strategy='ddp' (the default)"
        )
    return (
        f"replicas diverged at step {divergence['step']}: something changes the weights on "
        "some ranks only (code that depends on the rank, a parameter edited outside the "
        "optimizer, a layer DDP does not see)"
    )


def _unsharded(run: Record) -> str | None:
    coverage = run.get("coverage") or {}
    if coverage.get("verdict") != "bad":
        return None
    return f"the sampler does not split the data: {describe_coverage(coverage)}"


def _other_batch(run: Record, ref: Record) -> str | None:
    mine, theirs = run["setup"].get("global_batch"), ref["setup"].get("global_batch")
    if mine == theirs:
        return None
    return (
        f"a different global batch ({mine} with the workers, {theirs} alone): the loader is "
        "not built with ddpkit.prepare_loader, so the single process cannot read the workers' "
        "batch; the comparison is of two different trainings"
    )


def _data_differs(run: Record, ref: Record) -> str | None:
    common, differ = _sample_differences(run, ref)
    if not differ:
        return None
    shown = ", ".join(differ[:5])
    return (
        f"the data differs: {len(differ)} of {len(common)} samples the workers trained on are "
        f"not the single process's samples with the same index (such as {shown}): the "
        "dataset, or random augmentation, depends on the rank or on each process's random "
        "state. Build the dataset identically everywhere (seeded alike) before sharding it"
    )


def _initial_differs(initial: list[TensorDiff]) -> str | None:
    bad = [d.name for d in initial if not d.ok]
    if not bad:
        return None
    return (
        f"the runs started from different weights ({', '.join(bad[:4])} differ before the "
        "first step): the model is initialized from an unseeded random generator, or one "
        "seeded from the time or the process id. Fix: ddpkit.init(seed=S) before building it"
    )


def _batchnorm(run: Record) -> str | None:
    layers = run["setup"].get("batchnorm", [])
    if not layers or run["world_size"] < 2:
        return None
    return (
        f"unsynchronized BatchNorm ({', '.join(layers[:4])}): each rank normalizes over its "
        "own part of the batch, so N workers differ from one process by design; "
        "prepare_model(..., sync_batchnorm=True) synchronizes the statistics (GPU only)"
    )


def _dropout(run: Record) -> str | None:
    layers = run["setup"].get("dropout", [])
    if not layers or run["world_size"] < 2:
        return None
    return (
        f"Dropout ({', '.join(layers[:4])}) draws its masks from each rank's own random "
        "stream (as augmentation should), so N workers cannot repeat one process's masks; "
        "verify with dropout p=0, then train with it"
    )


def _precision(run: Record) -> str | None:
    precision = run["setup"].get("precision", "fp32")
    if precision == "fp32":
        return None
    rtol, atol = default_tolerances(precision)
    return (
        f"reduced precision ({precision}): rounding depends on how the batch is split; "
        f"differences beyond rtol {rtol:g} / atol {atol:g} over few steps are still suspicious"
    )


def _nondeterministic(reruns_differ: float | None) -> str | None:
    if not reruns_differ:
        return None
    return (
        f"the single process is not deterministic by itself: two runs of it differ by up to "
        f"{reruns_differ:.2e}. A non-deterministic op (atomics on GPU, cuDNN autotuning) or "
        "an unseeded random draw; try torch.use_deterministic_algorithms(True) and "
        "ddpkit.init(seed=S)"
    )


def _groups(values: list[int]) -> str:
    """'rank 0 differs from ranks 1,2' style text for per-rank fingerprints."""
    groups: dict[int, list[int]] = {}
    for rank, value in enumerate(values):
        groups.setdefault(value, []).append(rank)
    return " vs ".join(ranks_text(ranks) for ranks in groups.values())
