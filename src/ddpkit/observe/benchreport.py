"""Metrics a run reports for ``ddpkit bench``: one JSON line per record, written by rank 0.

``ddpkit bench`` sets ``DDPKIT_METRICS_FILE`` for the runs it starts; without it, reporting
does nothing, so a script behaves the same inside and outside a benchmark. The training loop
reports its set-up once and every epoch's metrics (:class:`BenchReport`, a callback of every
run); a loop of your own without ``TrainLoop`` calls :func:`report` itself.

Example:
    >>> import json, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "metrics.jsonl")
    >>> os.environ[METRICS_ENV] = path
    >>> report("epoch", epoch=1, loss=0.5, time_s=1.2, samples=128)
    >>> json.loads(open(path).read())["loss"]
    0.5
    >>> del os.environ[METRICS_ENV]
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ddpkit._core.protocol import METRICS_ENV
from ddpkit.errors import ConfigError
from ddpkit.runtime.callbacks import Callback, RunView
from ddpkit.runtime.collectives import is_main

KINDS = ("setup", "epoch")


def report(kind: str, **values: Any) -> None:
    """Append one record (``kind`` plus ``values``) to the benchmark's metrics file, if any.

    Hand-written loops report ``report("epoch", epoch=e, loss=..., time_s=..., samples=...)``
    once per epoch (``samples``: how many the epoch trained on, over all ranks), plus any
    validation metric as ``val_<name>``.

    Example:
        >>> report("epoch", epoch=1, loss=0.3, time_s=2.0, samples=1000)  # no-op outside bench
    """
    path = os.environ.get(METRICS_ENV)
    if not path or not is_main():
        return
    if kind not in KINDS:
        raise ConfigError(f"unknown report kind {kind!r}; use one of {', '.join(KINDS)}")
    with Path(path).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"kind": kind, **values}) + "\n")


def read_reports(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records a run wrote (empty when it wrote none).

    Example:
        >>> read_reports("/nonexistent/metrics.jsonl")
        []
    """
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


class BenchReport(Callback):
    """What ``ddpkit bench`` reads of a run: its set-up, then each epoch's metrics (rank 0).

    Example::

        TrainLoop(...)   # holds one; it writes only when bench set DDPKIT_METRICS_FILE
    """

    def on_fit_start(self, trainer: RunView) -> None:
        if trainer.setup is not None:  # the loop says its set-up before this hook
            report("setup", **trainer.setup.record())

    def on_train_epoch_end(self, trainer: RunView, metrics: dict[str, float]) -> None:
        report("epoch", **metrics)
