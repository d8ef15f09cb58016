"""Progress and metrics to Kubeflow Trainer's TrainJob status (KEP-2779), from rank 0.

Where the Trainer's ``TrainJobStatus`` feature is on, it gives each trainer pod an HTTPS
endpoint and two files (the variables' names are the Trainer's):

- ``KUBEFLOW_TRAINER_SERVER_URL``: ``https://.../namespaces/NS/trainjobs/NAME/status``;
- ``KUBEFLOW_TRAINER_SERVER_CA_CERT``: the CA file that signed the endpoint's certificate;
- ``KUBEFLOW_TRAINER_SERVER_TOKEN``: a service-account token file (rotated: read each time).

Rank 0 POSTs ``{"trainerStatus": {"progressPercentage", "estimatedRemainingSeconds",
"metrics": [{"name", "value"}], "lastUpdatedTime"}}`` (metric values are strings) at most
every 5 s, from a thread so that a slow endpoint never slows a step, and once more at the
end. ``kubectl get trainjob NAME -o jsonpath='{.status.trainerStatus}'`` shows it. A failed
post is warned about once and training goes on. A pure listener: a :class:`Callback` the loop
adds to its own when the variables are set, asking the loop where the run stands.

Example:
    >>> TrainJobStatus.from_environment({}, lambda: RunPosition(0, 1, 0, None)) is None
    True
"""

from __future__ import annotations

import json
import math
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ddpkit._core.log import logger
from ddpkit.runtime.callbacks import Callback

URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
CA_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"
EVERY_S = 5.0  # the Trainer's SDK throttles to one update per 5 s too
_TIMEOUT_S = 10.0
_MAX_METRICS = 256  # the API's limits: 256 metrics, names and values of 1..64 characters
_MAX_TEXT = 64


@dataclass(frozen=True)
class RunPosition:
    """Where a run stands: epoch ``epoch`` (from 0) of ``epochs``, ``done`` of its ``total``
    batches (None: a loader without a length), and whether it ``stopped`` early.

    Example:
        >>> RunPosition(1, 4, 5, 10).fraction()
        0.375
    """

    epoch: int
    epochs: int
    done: int
    total: int | None
    stopped: bool = False

    def fraction(self) -> float:
        """How much of the run is done: epochs and, with a sized loader, batches."""
        within = self.done / self.total if self.total else 0.0
        return min(1.0, (self.epoch + min(within, 1.0)) / max(1, self.epochs))


class TrainJobStatus(Callback):
    """Posts a run's progress to the TrainJob's status endpoint, from rank 0.

    Example::

        status = TrainJobStatus(url, ca_file, token_file, position=loop.position)
        status.report({"loss": 0.5})  # at most every ``every_s``; the hooks call it
        status.close(finished=True)
    """

    def __init__(
        self,
        url: str,
        ca_file: str,
        token_file: str,
        position: Callable[[], RunPosition],
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url, self.token_file, self.position = url, Path(token_file), position
        self._tls = ssl.create_default_context(cafile=ca_file)
        self.every_s, self._clock = every_s, clock
        self._started = clock()
        self._sent_at: float | None = None
        self._first_fraction: float | None = None
        self._metrics: dict[str, str] = {}
        self._thread: threading.Thread | None = None
        self._warned = False
        self.posted = 0  # successful posts, for the tests and the last line

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str], position: Callable[[], RunPosition]
    ) -> TrainJobStatus | None:
        """A reporter when the Trainer's three variables are set, else None."""
        if not all(environ.get(name) for name in (URL_ENV, CA_ENV, TOKEN_ENV)):
            return None
        return cls(environ[URL_ENV], environ[CA_ENV], environ[TOKEN_ENV], position)

    def on_train_batch_end(self, trainer: Any, batch: Any, metrics: Mapping[str, Any]) -> None:
        self.report(metrics)

    def on_train_epoch_end(self, trainer: Any, metrics: dict[str, float]) -> None:
        self.report(metrics)

    def on_fit_end(self, trainer: Any) -> None:
        self.close(finished=not self.position().stopped)

    def report(self, metrics: Mapping[str, Any]) -> None:
        """Keep ``metrics`` and post, unless a post went out less than ``every_s`` ago."""
        self._metrics.update(_metric_texts(metrics))
        now = self._clock()
        if self._sent_at is not None and now - self._sent_at < self.every_s:
            return
        if self._thread is not None and self._thread.is_alive():
            return  # the previous post is still on its way; the next one carries these
        self._sent_at = now
        self._thread = threading.Thread(
            target=self._post, args=(self.body(),), daemon=True, name="ddpkit-trainer-status"
        )
        self._thread.start()

    def close(self, finished: bool) -> None:
        """The last post: 100% when the run ``finished``, where it stopped otherwise."""
        if self._thread is not None:
            self._thread.join(_TIMEOUT_S)
        self._post(self.body(done=finished))

    def body(self, done: bool = False) -> dict[str, Any]:
        """The request's JSON: progress, the time left at this pace, the latest metrics."""
        fraction = 1.0 if done else self.position().fraction()
        status: dict[str, Any] = {
            "progressPercentage": int(fraction * 100),
            "metrics": [{"name": k, "value": v} for k, v in self._metrics.items()][:_MAX_METRICS],
            "lastUpdatedTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        remaining = 0.0 if done else self._remaining_s(fraction)
        if remaining is not None:
            status["estimatedRemainingSeconds"] = int(remaining)
        return {"trainerStatus": status}

    def _remaining_s(self, fraction: float) -> float | None:
        if self._first_fraction is None:  # a resumed run starts part-way: pace from here
            self._first_fraction = fraction
        gained = fraction - self._first_fraction
        if gained <= 0:
            return None
        return (self._clock() - self._started) * (1.0 - fraction) / gained

    def _post(self, body: dict[str, Any]) -> None:
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST")
        request.add_header("Content-Type", "application/json")
        try:
            request.add_header("Authorization", f"Bearer {self.token_file.read_text().strip()}")
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S, context=self._tls) as reply:
                reply.read()
            self.posted += 1
        except (OSError, ValueError) as err:  # URLError, HTTPError, ssl errors are OSErrors
            if not self._warned:
                logger.warning(
                    f"could not report progress to the TrainJob ({self.url}): "
                    f"{err}; training goes on"
                )
            self._warned = True


def _metric_texts(metrics: Mapping[str, Any]) -> dict[str, str]:
    texts = {}
    for name, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number) and name:
            texts[str(name)[:_MAX_TEXT]] = f"{number:.6g}"
    return texts
