"""``ddpkit bench`` outputs: results.json, results.csv, a Markdown table and two PNG charts.

The charts are the tutorials' two figures: training time per world size as bars, and the
training-loss curves of every size on one axes (the faster runs should train just as well).
They need matplotlib (``pip install ddpkit[bench]``); without it they are skipped with a
message and everything else is still written.

Example:
    >>> print(markdown_table([{"workers": 1, "global_batch": 32, "batch_policy": "per_device",
    ...     "wall_s": 5.0, "train_s": 4.0, "epoch_s": 2.0, "samples_per_s": 100.0,
    ...     "speedup": 1.0, "efficiency": 1.0, "final_loss": 0.1, "val_metric": None}]))
    | workers | global batch | wall | train | per epoch | samples/s | speedup | efficiency | ...
    |---|---|---|---|---|---|---|---|---|---|
    | 1 | 32 (per_device) | 5.00 s | 4.00 s | 2.000 s | 100 | 1.00x | 100% | 0.1000 | - |
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
)


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
            writer.writerow({**row, "val_metric": _val_text(row["val_metric"])})
    paths[2].write_text(markdown_table(summary["rows"]) + "\n", encoding="utf-8")
    return paths


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The scaling table, one row per world size.

    Example:
        >>> markdown_table([]).splitlines()[1]
        '|---|---|---|---|---|---|---|---|---|---|'
    """
    head = (
        "| workers | global batch | wall | train | per epoch | samples/s | speedup "
        "| efficiency | final loss | val |"
    )
    lines = [head, "|---" * 10 + "|"]
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
    return [_duration_chart(plt, rows, out), _loss_chart(plt, rows, out)]


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


def _save(plt: Any, figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _val_text(metric: dict[str, Any] | None) -> str:
    return "-" if metric is None else f"{metric['name']} {metric['value']:.4f}"
