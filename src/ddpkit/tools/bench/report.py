"""``ddpkit bench`` outputs: results.json, results.csv, a Markdown table and three PNG charts.

Two charts are the tutorials' figures: training time per world size as bars, and the
training-loss curves of every size on one axes (the faster runs should train just as well);
the third shows where a step's time goes at each size, as stacked bars (data, compute,
exposed sync, optimizer, other: :mod:`ddpkit.observe.steptime`). They need matplotlib
(``pip install ddpkit[bench]``); without it they are skipped with a message and everything
else is still written.

Example:
    >>> print(markdown_table([{"workers": 1, "global_batch": 32, "batch_policy": "per_device",
    ...     "wall_s": 5.0, "train_s": 4.0, "epoch_s": 2.0, "samples_per_s": 100.0,
    ...     "speedup": 1.0, "efficiency": 1.0, "final_loss": 0.1, "val_metric": None,
    ...     "step_ms": {"data": 1, "compute": 5, "sync": 0, "optimizer": 1, "other": 1},
    ...     "peak_mem_mb": 300.0}]))  # doctest: +ELLIPSIS
    | workers | global batch | wall | train | per epoch | samples/s | speedup | efficiency | ...
    |---|---|---|---|---|---|---|---|---|---|---|---|
    | 1 | 32 (per_device) | 5.00 s | 4.00 s | 2.000 s | 100 | 1.00x | 100% | 8.0 = 1.0 + ...
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

CSV_FIELDS = (
    "workers",
    "global_batch",
    "batch_policy",
    "wall_s",
    "train_s",
    "epoch_s",
    "samples_per_s",
    "speedup",
    "efficiency",
    "final_loss",
    "val_metric",
    "step_ms",
    "data_ms",
    "compute_ms",
    "sync_ms",
    "optimizer_ms",
    "other_ms",
    "peak_mem_mb",
)
PHASES = ("data", "compute", "sync", "optimizer", "other")
COLORS = ("#dd8452", "#4c72b0", "#c44e52", "#55a868", "#8c8c8c")


def write_results(summary: dict[str, Any], out: Path) -> list[Path]:
    """Write results.json, results.csv and results.md into ``out``; return their paths.

    Example::

        write_results(summary, Path("bench"))
    """
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.csv", out / "results.md"]
    paths[0].write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    with paths[1].open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in summary["rows"]:
            phases = {f"{name}_ms": ms for name, ms in (row.get("step_ms") or {}).items()}
            total = sum(phases.values()) if phases else None
            writer.writerow({**row, **phases, "step_ms": total,
                             "val_metric": _val_text(row["val_metric"])})  # fmt: skip
    paths[2].write_text(markdown_table(summary["rows"]) + "\n", encoding="utf-8")
    return paths


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The scaling table, one row per world size.

    Example:
        >>> markdown_table([]).splitlines()[1]
        '|---|---|---|---|---|---|---|---|---|---|---|---|'
    """
    head = (
        "| workers | global batch | wall | train | per epoch | samples/s | speedup "
        "| efficiency | ms/step = data + compute + sync + optimizer + other | peak memory "
        "| final loss | val |"
    )
    lines = [head, "|---" * 12 + "|"]
    for row in rows:
        cells = [
            str(row["workers"]),
            f"{row['global_batch']} ({row['batch_policy']})",
            f"{row['wall_s']:.2f} s",
            f"{row['train_s']:.2f} s",
            f"{row['epoch_s']:.3f} s",
            f"{row['samples_per_s']:.0f}",
            f"{row['speedup']:.2f}x",
            f"{row['efficiency']:.0%}",
            _breakdown_text(row.get("step_ms")),
            "-" if row.get("peak_mem_mb") is None else f"{row['peak_mem_mb']:.0f} MB",
            f"{row['final_loss']:.4f}",
            _val_text(row["val_metric"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_charts(summary: dict[str, Any], out: Path) -> list[Path] | str:
    """duration.png and loss.png in ``out``; a message instead when matplotlib is missing.

    Example::

        write_charts(summary, Path("bench"))
        # [PosixPath('bench/duration.png'), PosixPath('bench/loss.png')]
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return "charts skipped: matplotlib is not installed (pip install 'ddpkit[bench]')"
    rows = summary["rows"]
    charts = [_duration_chart(plt, rows, out), _loss_chart(plt, rows, out)]
    if all(row.get("step_ms") for row in rows):
        charts.append(_breakdown_chart(plt, rows, out))
    return charts


def _duration_chart(plt: Any, rows: list[dict[str, Any]], out: Path) -> Path:
    figure, axes = plt.subplots(figsize=(6, 4))
    labels = [f"{r['workers']} worker{'s' if r['workers'] > 1 else ''}" for r in rows]
    bars = axes.bar(labels, [r["train_s"] for r in rows], color="#4c72b0")
    for bar, row in zip(bars, rows, strict=True):
        axes.annotate(
            f"{row['train_s']:.3g} s\n{row['speedup']:.2f}x",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
        )
    axes.set_ylabel("training time (s)")
    axes.set_title("Training time by number of workers")
    axes.margins(y=0.2)
    return _save(plt, figure, out / "duration.png")


def _loss_chart(plt: Any, rows: list[dict[str, Any]], out: Path) -> Path:
    figure, axes = plt.subplots(figsize=(6, 4))
    for row in rows:
        epochs = range(1, len(row["losses"]) + 1)
        axes.plot(epochs, row["losses"], label=f"{row['workers']} worker(s)")
    axes.set_xlabel("epoch")
    axes.set_ylabel("training loss")
    axes.set_title("Training loss by number of workers")
    axes.legend()
    return _save(plt, figure, out / "loss.png")


def _breakdown_chart(plt: Any, rows: list[dict[str, Any]], out: Path) -> Path:
    """Stacked bars: each size's milliseconds per step, phase by phase."""
    figure, axes = plt.subplots(figsize=(6, 4))
    labels = [f"{r['workers']} worker{'s' if r['workers'] > 1 else ''}" for r in rows]
    bottom = [0.0] * len(rows)
    for name, color in zip(PHASES, COLORS, strict=True):
        heights = [row["step_ms"][name] for row in rows]
        axes.bar(labels, heights, bottom=bottom, label=name, color=color)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    axes.set_ylabel("milliseconds per step (mean over ranks)")
    axes.set_title("Where a step's time goes")
    axes.legend()
    return _save(plt, figure, out / "breakdown.png")


def _breakdown_text(phases: dict[str, float] | None) -> str:
    """``8.0 = 1.0 + 5.0 + 0.0 + 1.0 + 1.0`` (ms per step), ``-`` when not reported."""
    if not phases:
        return "-"
    total = sum(phases[name] for name in PHASES)
    return f"{total:.1f} = " + " + ".join(f"{phases[name]:.1f}" for name in PHASES)


def _save(plt: Any, figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _val_text(metric: dict[str, Any] | None) -> str:
    return "-" if metric is None else f"{metric['name']} {metric['value']:.4f}"
