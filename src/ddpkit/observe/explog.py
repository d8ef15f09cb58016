"""Experiment logs: TensorBoard event files and a CSV of the same points, from rank 0 only.

``log_dir=`` (the Trainer's or ``TrainLoop``'s built-in :class:`ExperimentLogCallback`)
writes at every optimizer step the step's metrics (rank 0's), learning rate(s) and samples/s,
and at every epoch's end its metrics reduced over ranks: as TensorBoard scalars and as rows
``step,tag,value,wall_time`` of ``metrics.csv``; ``TrainLoop.log`` adds points of your own
(the first point of a tag at a step stays). A resumed run continues the curves: points
written after the checkpoint it resumes from are dropped (TensorBoard's ``purge_step``; the
CSV rewritten), and the log is flushed at every checkpoint, so a ``kill -9`` leaves neither a
gap nor a duplicate. Under ``ddpkit verify``, ``bench`` and ``doctor --run`` the folder is the
tool's scratch. Without TensorBoard (``pip install "ddpkit[logs]"``) only the CSV is written.

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddpkit._core.log import logger
from ddpkit.checkpoint.redirect import resolve_log_dir
from ddpkit.data.batches import samples_in
from ddpkit.errors import ConfigError
from ddpkit.observe.trackers import Tracker, scalar, tracker_from
from ddpkit.runtime.callbacks import Callback, RunView
from ddpkit.runtime.collectives import is_main

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
        self._file: Any = None
        self._at: tuple[int, set[str]] = (-1, set())  # the step last logged, and its tags
        self.kept: list[list[str]] = []  # an earlier run's rows up to resume_step
        if not is_main():
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        self._file, self.kept = _csv_continued(self.csv_path, resume_step)
        self._rows = csv.writer(self._file)
        self._writer = _tensorboard_writer(self.folder, resume_step) if tensorboard else None

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """One point per metric (numbers or one-element tensors) at ``step``."""
        if self._file is None:
            return
        if self._at[0] != step:
            self._at = (step, set())
        now = time.time()
        for tag, value in metrics.items():
            if tag in self._at[1]:
                continue
            self._at[1].add(tag)
            number = scalar(value)
            self._rows.writerow([step, tag, repr(number), f"{now:.3f}"])
            if self._writer is not None:
                self._writer.add_scalar(tag, number, step, walltime=now)

    def flush(self) -> None:
        """Everything logged so far onto disk (at each checkpoint: a crash loses nothing
        that the resumed run will not log again)."""
        if self._file is not None:
            self._file.flush()
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the files (logging after this is ignored)."""
        self.flush()
        if self._writer is not None:
            self._writer.close()
        if self._file is not None:
            self._file.close()
        self._writer = self._file = None


def _csv_continued(path: Path, resume_step: int) -> tuple[Any, list[list[str]]]:
    """The CSV (its header and rows of steps up to ``resume_step`` kept), open for more,
    and the rows kept."""
    kept: list[list[str]] = []
    if path.exists():
        with path.open(newline="") as old:
            kept = [row for row in csv.reader(old) if row and row[0].isdigit()]
        kept = [row for row in kept if int(row[0]) <= resume_step]
    file = path.open("w", newline="")
    csv.writer(file).writerows([_COLUMNS, *kept])
    return file, kept


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


class ExperimentLogCallback(Callback):
    """What a run logs, and when: the built-in callback of ``log_dir=...`` and
    ``loggers=[...]`` (rank 0 writes; one tracker run per job, its id in each checkpoint).

    Example:
        >>> ExperimentLogCallback("runs/x/logs", loggers=["mlflow"]).rank_zero_only
        True
    """

    def __init__(
        self, log_dir: str | os.PathLike[str] | None = None, loggers: Sequence[Any] = ()
    ) -> None:
        self.log_dir = log_dir
        self.trackers: list[Tracker] = [tracker_from(spec) for spec in loggers]
        self.files: ExperimentLog | None = None
        self._open = False
        self._run_ids: dict[str, str] = {}  # tracker name -> run id, from a checkpoint
        self._step, self._since, self._samples = 0, time.perf_counter(), 0

    def opened(self, step: int) -> ExperimentLogCallback:
        """The run's logs, opened at ``step`` if they are not yet (a point logged early)."""
        if not self._open and is_main():
            self._open = True
            self.files = self._files(step) if self.log_dir is not None else None
            earlier = self.files.kept if self.files is not None else []
            for tracker in self.trackers:
                tracker.start(self._run_ids.get(tracker.name), step)
                tracker.fill_in(earlier)
        return self

    @property
    def started(self) -> list[Tracker]:
        """The trackers with an open run (none on ranks other than 0, or before opening)."""
        return self.trackers if self._open else []

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """One point per metric at ``step`` in every log of the run (rank 0)."""
        if not self._open:
            return
        numbers = {tag: scalar(value) for tag, value in metrics.items()}  # once, for all logs
        if self.files is not None:
            self.files.log(numbers, step)
        for tracker in self.trackers:
            tracker.log(numbers, step)

    def _files(self, step: int) -> ExperimentLog:
        assert self.log_dir is not None
        folder = resolve_log_dir(self.log_dir)
        if folder != Path(self.log_dir):
            logger.info(f"logs go to {folder} for this run; {self.log_dir} is left as it is")
        return ExperimentLog(folder, resume_step=step)

    def on_load_checkpoint(self, trainer: RunView, state: Mapping[str, Any]) -> None:
        self._run_ids.update(state.get("trackers", {}))

    def on_fit_start(self, trainer: RunView) -> None:
        self.opened(trainer.step)
        self._step, self._since, self._samples = trainer.step, time.perf_counter(), 0
        setup = trainer.setup.record() if trainer.setup is not None else {}
        facts = {f"ddpkit/{name}": value for name, value in setup.items()}
        for tracker in self.started:
            tracker.log_params({**tracker.params, **facts}, trainer.step)

    def on_train_batch_end(self, trainer: RunView, batch: Any, metrics: Mapping[str, Any]) -> None:
        self._samples += samples_in(batch) or 0  # a batch with no tensor counts none
        if trainer.step == self._step or not self._open:  # within an accumulation group
            return
        now = time.perf_counter()
        points = {f"train/{name}": value for name, value in metrics.items()}
        points.update(_learning_rates(trainer.optimizers))
        samples = self._samples * trainer.world.world_size
        points["train/samples_per_s"] = samples / max(now - self._since, 1e-9)
        self.log(points, trainer.step)
        self._step, self._since, self._samples = trainer.step, now, 0

    def on_train_epoch_end(self, trainer: RunView, metrics: Mapping[str, Any]) -> None:
        numbers = {f"epoch/{k}": v for k, v in metrics.items() if isinstance(v, int | float)}
        self.log(numbers, trainer.step)

    def on_save_checkpoint(self, trainer: RunView, state: dict[str, Any]) -> None:
        # Everything up to this step reaches the logs before the checkpoint exists.
        for tracker in self.started:
            tracker.flush()
        self.kept_in_memory(state)  # the files flushed, the run ids kept

    def kept_in_memory(self, state: dict[str, Any]) -> None:
        """A memory snapshot is taken (every step, :mod:`ddpkit.train.snapshots`): the log
        files are flushed, so a restart from that step neither loses points nor logs one
        twice, and the trackers' run ids are kept as a checkpoint keeps them. The trackers
        are not flushed each step (each flush is a call to their server).

        Example::

            explog.kept_in_memory(state)   # then the snapshot of ``state``
        """
        if self.files is not None:
            self.files.flush()
        state["trackers"] = {t.name: t.run_id for t in self.trackers if t.run_id is not None}

    def on_fit_end(self, trainer: RunView) -> None:
        if self.files is not None:
            self.files.close()
        for tracker in self.started:
            tracker.close()
            self._run_ids[tracker.name] = str(tracker.run_id)
        self.files, self._open = None, False  # a next run opens them again, from its step


def experiment_logs(
    log_dir: str | os.PathLike[str] | None, loggers: Sequence[Any]
) -> ExperimentLogCallback | None:
    """The logs callback of ``log_dir=`` and ``loggers=``, or None when neither is given.

    Example:
        >>> experiment_logs(None, []) is None
        True
    """
    return ExperimentLogCallback(log_dir, loggers) if log_dir is not None or loggers else None


def _learning_rates(optimizers: Mapping[str, Any]) -> dict[str, float]:
    """``train/lr`` (of the first parameter group), per optimizer when there are several."""
    rates = {name: float(opt.param_groups[0]["lr"]) for name, opt in optimizers.items()}
    if len(rates) == 1:
        return {"train/lr": next(iter(rates.values()))}
    return {f"train/lr/{name}": rate for name, rate in rates.items()}


def log_metrics(
    logs: ExperimentLogCallback | None, metrics: Mapping[str, Any], step: int, stepped: bool
) -> None:
    """``TrainLoop.log``: ``metrics`` at optimizer step ``step`` (one more once this batch's
    step was taken), the logs opened first should no batch have run yet.

    Example::

        log_metrics(loop.explog, {"train/grad_norm": norm}, loop.step, stepped=False)
    """
    if logs is None:
        raise ConfigError("TrainLoop.log needs TrainLoop(..., log_dir=... or loggers=[...])")
    logs.opened(step).log(metrics, step + int(stepped))
