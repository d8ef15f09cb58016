"""Experiment logs: TensorBoard event files and a CSV of the same points, from rank 0 only.

``Trainer(log_dir="runs/x/logs")`` writes, at every optimizer step, the step's loss (rank
0's latest batch), learning rate(s) and throughput (samples/s over all ranks), and at every
epoch's end the epoch's metrics (reduced over ranks, validation included): as TensorBoard
scalars (``tensorboard --logdir runs/x/logs``, readable while the job runs) and as rows
``step,tag,value,wall_time`` of ``metrics.csv``. A hand-written loop logs through
:class:`ExperimentLog` itself.

A resumed run continues the same curves: the points an interrupted run wrote after the
checkpoint it resumes from are dropped (TensorBoard's ``purge_step``, and the CSV rewritten
without them), and everything up to a checkpoint is flushed when it is saved, so a
``kill -9`` leaves neither a gap nor a duplicate. TensorBoard is an optional extra
(``pip install "ddpkit[logs]"``); without it only the CSV is written, and ddpkit says so.

Example:
    >>> import tempfile, ddpkit
    >>> _ = ddpkit.init()
    ddpkit: world size 1 ...
    >>> log = ExperimentLog(tempfile.mkdtemp(), resume_step=0, tensorboard=False)
    >>> log.log({"train/loss": 0.5}, step=1)
    >>> log.close()
    >>> log.csv_path.read_text().splitlines()[1].split(",")[:3]
    ['1', 'train/loss', '0.5']
    >>> ddpkit.shutdown()
"""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddpkit._core.log import logger
from ddpkit.data.batches import batch_size_of
from ddpkit.runtime.collectives import is_main
from ddpkit.train.callbacks import Callback

CSV_NAME = "metrics.csv"
_COLUMNS = ["step", "tag", "value", "wall_time"]


class ExperimentLog:
    """Scalars to TensorBoard and ``metrics.csv`` in ``log_dir``; a no-op on ranks other
    than 0. ``resume_step``: the step training continues from (0 for a fresh run): points of
    an earlier run after it are dropped.

    Example::

        log = ExperimentLog("runs/x/logs", resume_step=loop.step)
        log.log({"train/loss": loss.item(), "train/lr": opt.param_groups[0]["lr"]}, loop.step)
    """

    def __init__(
        self, log_dir: str | os.PathLike[str], resume_step: int = 0, tensorboard: bool = True
    ) -> None:
        self.folder = Path(log_dir)
        self.csv_path = self.folder / CSV_NAME
        self._writer: Any = None
        self._rows: Any = None
        if not is_main():
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        self._rows = _csv_continued(self.csv_path, resume_step)
        self._writer = _tensorboard_writer(self.folder, resume_step) if tensorboard else None

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """One point per metric (numbers or one-element tensors) at ``step``."""
        if self._rows is None:
            return
        now = time.time()
        for tag, value in metrics.items():
            number = float(value.detach() if hasattr(value, "detach") else value)
            self._rows.writerow([step, tag, repr(number), f"{now:.3f}"])
            if self._writer is not None:
                self._writer.add_scalar(tag, number, step, walltime=now)

    def flush(self) -> None:
        """Everything logged so far onto disk (at each checkpoint: a crash loses nothing
        that the resumed run will not log again)."""
        if self._rows is not None:
            self._rows.file.flush()
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the files (logging after this is ignored)."""
        self.flush()
        if self._writer is not None:
            self._writer.close()
        if self._rows is not None:
            self._rows.file.close()
        self._writer = self._rows = None


class _Rows:
    """A csv writer that keeps its file at hand."""

    def __init__(self, file: Any) -> None:
        self.file = file
        self._writer = csv.writer(file)

    def writerow(self, row: list[Any]) -> None:
        self._writer.writerow(row)


def _csv_continued(path: Path, resume_step: int) -> _Rows:
    """The CSV opened for appending, without the rows of steps after ``resume_step``."""
    kept: list[list[str]] = []
    if path.exists():
        with path.open(newline="") as old:
            kept = [row for row in csv.reader(old) if row and row[0].isdigit()]
        kept = [row for row in kept if int(row[0]) <= resume_step]
    file = path.open("w", newline="")
    rows = _Rows(file)
    rows.writerow(_COLUMNS)
    for row in kept:
        rows.writerow(row)
    return rows


def _tensorboard_writer(folder: Path, resume_step: int) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.warning(
            f"tensorboard is not installed: writing {folder / CSV_NAME} only "
            '(pip install "ddpkit[logs]" for TensorBoard event files)'
        )
        return None
    # purge_step: TensorBoard's readers drop the earlier files' points from this step on.
    return SummaryWriter(str(folder), purge_step=resume_step + 1, flush_secs=10)


def experiment_log(log_dir: str | os.PathLike[str] | None) -> list[Callback]:
    """The Trainer's experiment-log callback for ``log_dir`` (none without one).

    Example:
        >>> experiment_log(None)
        []
    """
    return [] if log_dir is None else [ExperimentLogger(log_dir)]


class ExperimentLogger(Callback):
    """What the Trainer logs, and when: the callback ``Trainer(log_dir=...)`` adds.

    Example:
        >>> ExperimentLogger("runs/x/logs").rank_zero_only
        True
    """

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self.log_dir = log_dir
        self.log: ExperimentLog | None = None
        self._step, self._since, self._samples = 0, time.perf_counter(), 0

    def on_fit_start(self, trainer: Any) -> None:
        self.log = ExperimentLog(self.log_dir, resume_step=trainer.step)
        self._step, self._since, self._samples = trainer.step, time.perf_counter(), 0

    def on_train_batch_end(self, trainer: Any, batch: Any, metrics: Mapping[str, Any]) -> None:
        self._samples += batch_size_of(batch) or 0
        if trainer.step == self._step or self.log is None:  # within an accumulation group
            return
        now = time.perf_counter()
        points = {f"train/{name}": value for name, value in metrics.items()}
        points.update(_learning_rates(trainer.optimizers))
        samples = self._samples * trainer.world.world_size
        points["train/samples_per_s"] = samples / max(now - self._since, 1e-9)
        self.log.log(points, trainer.step)
        self._step, self._since, self._samples = trainer.step, now, 0

    def on_train_epoch_end(self, trainer: Any, metrics: Mapping[str, Any]) -> None:
        if self.log is not None:
            numbers = {f"epoch/{k}": v for k, v in metrics.items() if isinstance(v, int | float)}
            self.log.log(numbers, trainer.step)

    def on_save_checkpoint(self, trainer: Any, state: Any) -> None:
        if self.log is not None:
            self.log.flush()

    def on_fit_end(self, trainer: Any) -> None:
        if self.log is not None:
            self.log.close()


def _learning_rates(optimizers: Mapping[str, Any]) -> dict[str, float]:
    """``train/lr`` (of the first parameter group), per optimizer when there are several."""
    rates = {name: float(opt.param_groups[0]["lr"]) for name, opt in optimizers.items()}
    if len(rates) == 1:
        return {"train/lr": next(iter(rates.values()))}
    return {f"train/lr/{name}": rate for name, rate in rates.items()}
