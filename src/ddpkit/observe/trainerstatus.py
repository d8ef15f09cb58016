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
post is warned about once and training goes on.

Example:
    >>> TrainerStatus.from_environment({}) is None
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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ddpkit._core.log import logger

URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
CA_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"
EVERY_S = 5.0  # the Trainer's SDK throttles to one update per 5 s too
_TIMEOUT_S = 10.0
_MAX_METRICS = 256  # the API's limits: 256 metrics, names and values of 1..64 characters
_MAX_TEXT = 64


class TrainerStatus:
    """Posts a run's progress to the TrainJob's status endpoint.

    Example::

        status = TrainerStatus(url, ca_file, token_file)
        status.epoch_started(0, 10, total=100, done=0)
        status.batch_done(); status.report({"loss": 0.5})
        status.close(finished=True)
    """

    def __init__(
        self,
        url: str,
        ca_file: str,
        token_file: str,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url, self.token_file = url, Path(token_file)
        self._tls = ssl.create_default_context(cafile=ca_file)
        self.every_s, self._clock = every_s, clock
        self._started = clock()
        self._sent_at: float | None = None
        self._first_fraction: float | None = None
        self._epoch, self._epochs, self._done = 0, 1, 0
        self._total: int | None = None
        self._metrics: dict[str, str] = {}
        self._thread: threading.Thread | None = None
        self._warned = False
        self.posted = 0  # successful posts, for the tests and the last line

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> TrainerStatus | None:
        """A reporter when the Trainer's three variables are set, else None."""
        if not all(environ.get(name) for name in (URL_ENV, CA_ENV, TOKEN_ENV)):
            return None
        return cls(environ[URL_ENV], environ[CA_ENV], environ[TOKEN_ENV])

    def epoch_started(self, epoch: int, epochs: int, total: int | None, done: int) -> None:
        """Epoch ``epoch`` of ``epochs`` starts, ``done`` of its ``total`` batches behind."""
        self._epoch, self._epochs, self._total, self._done = epoch, max(1, epochs), total, done

    def batch_done(self) -> None:
        self._done += 1

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
        fraction = 1.0 if done else self.fraction()
        status: dict[str, Any] = {
            "progressPercentage": int(fraction * 100),
            "metrics": [{"name": k, "value": v} for k, v in self._metrics.items()][:_MAX_METRICS],
            "lastUpdatedTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        remaining = 0.0 if done else self._remaining_s(fraction)
        if remaining is not None:
            status["estimatedRemainingSeconds"] = int(remaining)
        return {"trainerStatus": status}

    def fraction(self) -> float:
        """How much of the run is done: epochs and, with a sized loader, batches."""
        within = self._done / self._total if self._total else 0.0
        return min(1.0, (self._epoch + min(within, 1.0)) / self._epochs)

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
