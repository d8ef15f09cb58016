"""Does one epoch show every sample exactly once across the ranks? The sampler check.

Each rank lists the dataset indices its loader's sampler yields for the epoch; one gather
brings them together and they are counted. ``DistributedSampler`` (what ``prepare_loader``
uses) may repeat a few indices so every rank has as many (``uneven="pad"``) or leave a few
out (``"drop"``): those are expected and reported as such. Anything else, a loader that is
not sharded, ranks that shuffle with different seeds, a wrong ``rank``/``num_replicas``,
shows up as samples seen twice or never. Samplers whose order is random per call (torch's
``RandomSampler``) are not iterated, since that would consume the random stream training
uses; they are judged by their lengths alone.

Example:
    >>> count_coverage([[0, 2, 4], [1, 3, 0]], dataset_size=5, expected_repeats=1)["verdict"]
    'ok'
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils.data import DistributedSampler, SequentialSampler

from ddpkit.runtime.collectives import all_gather_rows, all_gather_rows_count

_EXAMPLES = 5


def sampler_coverage(loader: Any) -> dict[str, Any]:
    """This epoch's coverage over all ranks (a collective: every rank calls it).

    Example::

        sampler_coverage(train_loader)["verdict"]   # 'ok'
    """
    plan = getattr(loader, "epoch_plan", None)  # a loader that deals its own (ReplicaBatches)
    if callable(plan):
        indices, how = plan()
        report = count_coverage([indices], len(loader.dataset))
        ok = report["verdict"] == "ok"
        text = f"{report['dataset']} samples in {how}"
        return {"sampler": type(loader).__name__, **report, **({"text": text} if ok else {})}
    sampler = getattr(loader, "sampler", None)
    dataset_size = len(loader.dataset)
    kind = type(sampler).__name__
    if not listable(sampler):
        return _by_length(kind, all_gather_rows_count(len(loader)), loader, dataset_size)
    mine = torch.tensor(list(sampler), dtype=torch.int64)  # type: ignore[arg-type]
    lists = [rows.tolist() for rows in all_gather_rows(mine)]
    report = count_coverage(lists, dataset_size, _expected_repeats(sampler, dataset_size))
    return {"sampler": kind, **report}


def count_coverage(
    lists: list[list[int]], dataset_size: int, expected_repeats: int = 0
) -> dict[str, Any]:
    """Count one epoch's indices over the ranks; ``expected_repeats`` is the sampler's padding.

    Example:
        >>> report = count_coverage([[0, 1], [1, 2]], dataset_size=4)
        >>> report["verdict"], report["missing"], report["repeated"]
        ('bad', [3], [1])
    """
    counts = Counter(index for indices in lists for index in indices)
    missing = [i for i in range(dataset_size) if counts[i] == 0]
    extra = sum(count - 1 for count in counts.values() if count > 1)
    repeated = sorted(i for i, count in counts.items() if count > 1)
    padding_only = extra == expected_repeats and not missing
    dropped_only = extra == 0 and len(missing) == -expected_repeats
    return {
        "dataset": dataset_size,
        "ranks": len(lists),
        "per_rank": [len(indices) for indices in lists],
        "missing": missing[:_EXAMPLES],
        "missing_count": len(missing),
        "repeated": repeated[:_EXAMPLES],
        "extra_count": extra,
        "expected_repeats": expected_repeats,
        "verdict": "ok" if padding_only or dropped_only else "bad",
    }


def describe_coverage(report: dict[str, Any]) -> str:
    """One line for ``ddpkit verify``'s output.

    Example:
        >>> print(describe_coverage(count_coverage([[0, 2], [1, 0]], 3, expected_repeats=1)))
        3 samples, each exactly once per epoch across 2 ranks (2 per rank); 1 repeated to even
        out the shards (padding)
    """
    if "text" in report:  # judged by lengths alone
        return str(report["text"])
    size, ranks, per_rank = report["dataset"], report["ranks"], report["per_rank"]
    base = f"{size} samples, "
    if report["verdict"] == "ok":
        across = f"{ranks} rank{'s' if ranks != 1 else ''}"
        text = f"{base}each exactly once per epoch across {across} ({_per_rank(per_rank)})"
        return text + _padding_note(report["expected_repeats"])
    return base + _problem(report)


def _problem(report: dict[str, Any]) -> str:
    parts = []
    if report["extra_count"] > report["expected_repeats"]:
        shown = ", ".join(map(str, report["repeated"]))
        parts.append(f"{report['extra_count']} extra visits of samples such as {shown}")
    if report["missing_count"]:
        shown = ", ".join(map(str, report["missing"]))
        parts.append(f"{report['missing_count']} never seen, such as {shown}")
    ranks = report["ranks"]
    return f"per epoch over {ranks} ranks ({_per_rank(report['per_rank'])}): " + "; ".join(parts)


def _padding_note(expected: int) -> str:
    if expected > 0:
        return f"; {expected} repeated to even out the shards (padding)"
    if expected < 0:
        return f"; {-expected} left out to even out the shards (uneven='drop')"
    return ""


def _per_rank(per_rank: list[int]) -> str:
    return f"{per_rank[0]} per rank" if len(set(per_rank)) == 1 else f"{per_rank} per rank"


def listable(sampler: object) -> bool:
    """True for samplers that yield the same order however often they are iterated.

    Listing any other sampler would draw from the random stream the training uses.

    Example:
        >>> listable(torch.utils.data.RandomSampler(range(3)))
        False
    """
    return isinstance(sampler, (DistributedSampler, SequentialSampler)) or bool(
        getattr(sampler, "deterministic", False)
    )


def _expected_repeats(sampler: object, dataset_size: int) -> int:
    """Padding (> 0) or dropped samples (< 0) a DistributedSampler adds by design."""
    if isinstance(sampler, DistributedSampler):
        return int(sampler.total_size) - dataset_size
    return 0


def _by_length(kind: str, lengths: list[int], loader: Any, dataset_size: int) -> dict[str, Any]:
    batch = getattr(loader, "batch_size", None) or 1
    samples = sum(lengths) * batch  # lengths are batches per rank
    text = f"{kind} cannot be listed without consuming its random stream; {samples} samples"
    if len(lengths) > 1 and samples >= 2 * dataset_size:
        text += (
            f" drawn per epoch over {len(lengths)} ranks from {dataset_size}: each sample is "
            "seen about once per rank, so the loader is not sharded (use "
            "ddpkit.prepare_loader or torch's DistributedSampler)"
        )
        return {"sampler": kind, "verdict": "bad", "text": text}
    return {"sampler": kind, "verdict": "unknown", "text": text + " per epoch"}
