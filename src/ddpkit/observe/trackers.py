"""Experiment trackers beside TensorBoard and the CSV: MLflow and Weights & Biases.

``Trainer(..., loggers=["mlflow", "wandb"])`` (or configured objects:
``loggers=[MLflowLogger(experiment="wine", params=vars(args))]``) logs what ``log_dir``
logs, the same points at the same steps, to one tracker run per job:

- rank 0 alone talks to the tracker; the other ranks never import it;
- the run's id is kept in every checkpoint, so a resumed job, even requeued on other hosts,
  continues the same run;
- the points a killed job sent after its last checkpoint are already in the run, and the
  tracker cannot take them back: the resumed job asks the tracker which steps it holds per
  metric and skips those, so every step is there once (MLflow: the tracking server; W&B
  offline: the run's local files; W&B online: the run's step counter);
- points a tracker lost with a killed process (W&B offline keeps them in memory until the
  run finishes) are sent again from ``log_dir``'s CSV, flushed at every checkpoint: with
  ``log_dir`` set, the run holds every step up to the checkpoint resumed from;
- hyperparameters (``params=``) and the start-up facts (``ddpkit/world_size``,
  ``ddpkit/global_batch``, ``ddpkit/strategy``, ``ddpkit/precision``, ...) are logged once;
  a resumed job whose facts changed (another world size) records the new value under
  ``ddpkit/<fact> at step <N>`` (names a tracker accepts: MLflow refuses ``@``);
- points are sent in batches, every ``flush_every`` seconds and at each checkpoint, so a
  slow tracker does not slow the steps; a tracker that fails mid-run is warned about and its
  points kept for the next try; one that cannot be reached at the start is an error.

Example:
    >>> MLflowLogger(experiment="wine").name
    'mlflow'
    >>> tracker_from("wandb").name
    'wandb'
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from ddpkit._core.log import logger
from ddpkit._core.renamed import renamed_keywords
from ddpkit.errors import ConfigError
from ddpkit.observe.wandbfiles import logged_config, logged_steps

Point = tuple[str, float, int, float]  # tag, value, step, wall time (s)


@renamed_keywords({"flush_every_s": "flush_every"}, removed_in="0.3")
class Tracker:
    """What every tracker logger shares: skipping the steps the run already holds, batching,
    the facts and hyperparameters once. Subclasses open, send and finish.

    Example:
        >>> class Printing(Tracker):
        ...     name = "print"
        ...     def _open(self, run_id): return run_id or "run-1", {"train/loss": 3}
        ...     def _send(self, points): print([(tag, step) for tag, _, step, _ in points])
        >>> tracker = Printing()
        >>> tracker.start("run-1", step=2)
        ddpkit: print: continuing run run-1 at step 2 (it holds points up to step 3; ...)
        >>> tracker.log({"train/loss": 0.5}, step=3); tracker.log({"train/loss": 0.4}, step=4)
        >>> tracker.flush()
        [('train/loss', 4)]
    """

    name: ClassVar[str] = "tracker"
    hint: ClassVar[str] = "check the tracker's settings"  # what to do when it cannot start

    def __init__(self, params: Mapping[str, Any] | None = None, flush_every: float = 5.0):
        self.params = dict(params or {})
        self.flush_every = flush_every
        self.run_id: str | None = None
        self._held: dict[str, int] = {}  # per metric: the highest step the run already holds
        self._floor = -1  # the highest step it holds for every metric (W&B online)
        self._pending: list[Point] = []
        self._sent_at = time.monotonic()

    def start(self, run_id: str | None, step: int) -> None:
        """Open the run; ``run_id`` (from a checkpoint): continue that run from ``step``."""
        try:
            self.run_id, self._held = self._open(run_id)
        except ConfigError:
            raise
        except Exception as err:  # the tracker's own error, deep in its code: say it once
            cause = (str(err).strip() or type(err).__name__).splitlines()[0]
            raise ConfigError(
                f"{self.name}: could not open the run ({cause}); {self.hint}"
            ) from None
        if run_id is not None and run_id == self.run_id:
            kept = max([*self._held.values(), self._floor, 0])
            said = f"it holds points up to step {kept}; those are not sent again"
            logger.info(f"{self.name}: continuing run {run_id} at step {step} ({said})")

    def log_params(self, params: Mapping[str, Any], step: int) -> None:
        """Log the parameters the run lacks; one whose value changed (a resumed job on
        another world size) under ``<key> at step <step>``: a tracker's parameters are fixed.
        """
        texts = {k: _text(v) for k, v in params.items() if v is not None}
        held = self._held_params()
        self._add_params({k: v for k, v in texts.items() if k not in held})
        changed = {k: v for k, v in texts.items() if k in held and held[k] != v}
        if changed:
            self._note_changed({changed_name(k, step): v for k, v in changed.items()})

    def fill_in(self, rows: Sequence[Sequence[str]]) -> None:
        """Send the points of ``log_dir``'s CSV (``step,tag,value,wall_time`` rows up to the
        checkpoint resumed from) that the run lacks: a tracker that lost a killed process's
        last points (W&B offline writes its file only when the run finishes) gets them."""
        for step, tag, value, at in sorted(rows, key=lambda row: int(row[0])):
            if int(step) > max(self._held.get(tag, -1), self._floor):
                self._pending.append((tag, float(value), int(step), float(at)))
        if self._pending:
            logger.info(f"{self.name}: {len(self._pending)} earlier points it lacked sent "
                        "again from the log_dir's CSV")  # fmt: skip
            self.flush()

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Queue one point per metric at ``step``; sent within ``flush_every`` seconds."""
        now = time.time()
        for tag, value in metrics.items():
            if step > max(self._held.get(tag, -1), self._floor):
                self._pending.append((tag, scalar(value), step, now))
        if time.monotonic() - self._sent_at >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Send the queued points (at each checkpoint and at the end)."""
        self._sent_at = time.monotonic()
        if not self._pending:
            return
        try:
            self._send(self._pending)
        except Exception as err:  # a tracker's hiccup must not stop training
            logger.warning(f"{self.name}: {len(self._pending)} points not sent ({err}); "
                           "they are kept and sent at the next try")  # fmt: skip
            return
        self._pending = []

    def close(self, failed: bool = False) -> None:
        """Send what is queued and mark the run finished (or failed)."""
        self.flush()
        self._finish(failed)

    def _open(self, run_id: str | None) -> tuple[str, dict[str, int]]:
        """The run's id, and per metric the highest step it holds (empty for a new run)."""
        raise NotImplementedError

    def _send(self, points: Sequence[Point]) -> None:
        raise NotImplementedError

    def _held_params(self) -> Mapping[str, str]:
        """The parameters the run already holds (none for a tracker without them)."""
        return {}

    def _add_params(self, params: Mapping[str, str]) -> None:
        """Log parameters the run lacks."""

    def _note_changed(self, changed: Mapping[str, str]) -> None:
        """Record new values of held parameters, already named by :func:`changed_name`."""

    def _finish(self, failed: bool) -> None:
        """Mark the run ended."""


@renamed_keywords({"flush_every_s": "flush_every"}, removed_in="0.3")
class MLflowLogger(Tracker):
    """An MLflow run per job on ``tracking_uri`` (default: ``MLFLOW_TRACKING_URI``, else
    ``./mlruns``), in ``experiment`` (default: ``MLFLOW_EXPERIMENT_NAME``, else "ddpkit").
    Needs ``pip install "ddpkit[mlflow]"``.

    Example::

        Trainer(model, opt, loggers=[MLflowLogger("http://mlflow:5000", "wine",
                                                  params=vars(args))])
    """

    name = "mlflow"
    hint = "check MLFLOW_TRACKING_URI / MLflowLogger(tracking_uri=...) and the server"

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        run_name: str | None = None,
        params: Mapping[str, Any] | None = None,
        flush_every: float = 5.0,
    ) -> None:
        super().__init__(params, flush_every)
        self.tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        self.experiment = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "ddpkit"
        self.run_name = run_name
        self._client: Any = None

    def _open(self, run_id: str | None) -> tuple[str, dict[str, int]]:
        client = self._client = _mlflow_client(self.tracking_uri)
        if run_id is not None and not self._exists(run_id):
            logger.warning(f"mlflow: run {run_id} of the checkpoint is not on "
                           f"{client.tracking_uri}; this job continues in a new run")  # fmt: skip
            run_id = None
        if run_id is None:
            found = client.get_experiment_by_name(self.experiment)
            experiment = found.experiment_id if found else client.create_experiment(self.experiment)
            return client.create_run(experiment, run_name=self.run_name).info.run_id, {}
        client.update_run(run_id, status="RUNNING")
        held = {}
        for key in client.get_run(run_id).data.metrics:
            held[key] = max(point.step for point in client.get_metric_history(run_id, key))
        return run_id, held

    def _exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self._client.get_run(run_id)
        except MlflowException as err:
            if err.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise
        return True

    def _send(self, points: Sequence[Point]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(tag, value, int(at * 1000), step) for tag, value, step, at in points]
        for first in range(0, len(metrics), 1000):  # MLflow's limit per batch
            self._client.log_batch(self.run_id, metrics=metrics[first : first + 1000])

    def _held_params(self) -> Mapping[str, str]:
        return dict(self._client.get_run(self.run_id).data.params)

    def _add_params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        new = [Param(k, v) for k, v in params.items()]
        for first in range(0, len(new), 100):  # MLflow's limit per batch
            self._client.log_batch(self.run_id, params=new[first : first + 100])

    def _note_changed(self, changed: Mapping[str, str]) -> None:
        for name, value in changed.items():  # a parameter cannot change: a tag says it
            self._client.set_tag(self.run_id, name, value)

    def _finish(self, failed: bool) -> None:
        self._client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


@renamed_keywords({"flush_every_s": "flush_every"}, removed_in="0.3")
class WandbLogger(Tracker):
    """A Weights & Biases run per job in ``project`` (default: ``WANDB_PROJECT``, else
    "ddpkit"); ``mode`` "online", "offline" (sync later with ``wandb sync``) or None
    (``WANDB_MODE``); files under ``dir`` (default: ``WANDB_DIR``, else the working
    directory). Needs ``pip install "ddpkit[wandb]"``.

    Example::

        Trainer(model, opt, loggers=[WandbLogger(project="wine", mode="offline")])
    """

    name = "wandb"
    hint = ("log in with `wandb login` (or set WANDB_API_KEY), or log offline: WANDB_MODE=offline"
            " or WandbLogger(mode='offline'), then `wandb sync`")  # fmt: skip

    def __init__(
        self,
        project: str | None = None,
        mode: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        run_name: str | None = None,
        params: Mapping[str, Any] | None = None,
        flush_every: float = 5.0,
    ) -> None:
        super().__init__(params, flush_every)
        self.project = project or os.environ.get("WANDB_PROJECT") or "ddpkit"
        self.mode, self.dir, self.run_name = mode, dir, run_name
        self._run: Any = None
        self._earlier_config: dict[str, Any] = {}  # an offline run's, from its earlier files

    def _open(self, run_id: str | None) -> tuple[str, dict[str, int]]:
        wandb = _imported("wandb", "wandb")
        if self.dir is not None:
            Path(self.dir).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=self.project, mode=self.mode, dir=self.dir, name=self.run_name,
            id=run_id, resume="allow" if run_id else None,
            settings=wandb.Settings(silent=True),
        )  # fmt: skip
        if run_id is None:
            return str(self._run.id), {}
        return str(self._run.id), self._held_by(run_id)

    def _held_by(self, run_id: str) -> dict[str, int]:
        if self._run.offline:  # no server to ask: the earlier processes' files say it
            folder = Path(self._run.dir).parent.parent
            self._earlier_config = logged_config(folder, run_id)
            return logged_steps(folder, run_id)
        self._floor = int(getattr(self._run, "starting_step", 0)) - 1  # W&B's one counter
        return {}

    def _send(self, points: Sequence[Point]) -> None:
        rows: dict[int, dict[str, float]] = {}
        for tag, value, step, _ in points:
            rows.setdefault(step, {})[tag] = value
        for step in sorted(rows):
            self._run.log(rows[step], step=step)

    def _held_params(self) -> Mapping[str, str]:
        # A resumed offline run starts with an empty config: its earlier files hold the first.
        return {**self._earlier_config, **dict(self._run.config)}

    def _add_params(self, params: Mapping[str, str]) -> None:
        self._run.config.update(dict(params))

    def _note_changed(self, changed: Mapping[str, str]) -> None:
        self._run.config.update(dict(changed))

    def _finish(self, failed: bool) -> None:
        self._run.finish(exit_code=1 if failed else 0)


def changed_name(key: str, step: int) -> str:
    """The name a parameter's new value is logged under when a resumed job changed it.

    Example:
        >>> changed_name("ddpkit/world_size", 120)
        'ddpkit/world_size at step 120'
    """
    return f"{key} at step {step}"


TRACKERS: dict[str, type[Tracker]] = {"mlflow": MLflowLogger, "wandb": WandbLogger}


def tracker_from(spec: str | Tracker) -> Tracker:
    """A tracker logger from ``loggers=[...]``: an object as it is, or a name.

    Example:
        >>> tracker_from("comet")
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: loggers: unknown tracker 'comet'; known: mlflow, wandb ...
    """
    if isinstance(spec, Tracker):
        return spec
    if spec not in TRACKERS:
        raise ConfigError(
            f"loggers: unknown tracker {spec!r}; known: {', '.join(TRACKERS)} (TensorBoard "
            "and the CSV are log_dir=...; or pass a Tracker object)"
        )
    return TRACKERS[spec]()


def _mlflow_client(uri: str | None) -> Any:
    mlflow = _imported("mlflow", "mlflow")
    if uri and uri.startswith(("http://", "https://")):
        _check_reachable(uri)
    return mlflow.MlflowClient(tracking_uri=uri)


def _check_reachable(uri: str) -> None:
    """Fail in seconds, naming the server, instead of MLflow's minutes of retries."""
    import requests

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=10)
    except requests.RequestException as err:
        raise ConfigError(
            f"the MLflow tracking server {uri} did not answer ({type(err).__name__}); start "
            "it, or set MLFLOW_TRACKING_URI / MLflowLogger(tracking_uri=...) to one that runs"
        ) from None


def _imported(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f'loggers: the {module} tracker needs its package: pip install "ddpkit[{extra}]"'
        ) from None


def scalar(value: Any) -> float:
    """A metric as a float: a number, or a one-element tensor (one device sync).

    Example:
        >>> scalar(3)
        3.0
    """
    return float(value.detach() if hasattr(value, "detach") else value)


def _text(value: Any) -> str:
    text = str(value) if not isinstance(value, float) or math.isfinite(value) else repr(value)
    return text[:500]  # trackers cap a parameter's length
