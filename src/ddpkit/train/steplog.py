"""What the training loop shows as it runs: tqdm's bar on a terminal, a line every N steps.

The bar hides itself when stderr is not a terminal (CI logs, pipes, ``ddpkit run``'s
workers), which is where a line every ``log_every`` optimizer steps helps: epoch, batch,
rank 0's loss on its latest batch and the pace, as the ImageNet tutorials' ``--print-freq``
shows it, with the step's other metrics. On a terminal, rank 0's bar shows the latest
step's metrics, refreshed at most twice a second. Only rank 0 prints, and only its metrics
are read (one ``.item()`` each per line, or per refresh).

Example:
    >>> import torch, types
    >>> log = StepLog(every=2)
    >>> at = types.SimpleNamespace(epoch=0, batches=2)  # an EpochProgress: epoch 1, 2 batches
    >>> log.step_done(1, at, 3, 5, {"loss": torch.tensor(0.5)})  # first step: quiet
    >>> log.step_done(2, at, 3, 5, {"loss": torch.tensor(0.75)})  # doctest: +ELLIPSIS
    epoch 1/3  batch 2/5  loss 0.7500  (... s/step)
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from tqdm import tqdm

from ddpkit.runtime.collectives import is_main, print0


def progress_bar(batches: Iterable[Any], total: int | None, done: int, desc: str) -> Iterable[Any]:
    """tqdm over ``batches`` on rank 0 (hidden when stderr is not a terminal), starting at
    ``done`` of ``total`` for a resumed epoch.

    Example:
        >>> list(progress_bar([1, 2], total=3, done=1, desc="epoch 1/1"))
        [1, 2]
    """
    # disable=None lets tqdm hide itself when stderr is not a terminal (CI logs, pipes).
    hidden = None if is_main() else True
    bar: Iterable[Any] = tqdm(
        batches, desc=desc, total=total, initial=done, leave=False, disable=hidden
    )
    return bar


class StepLog:
    """One line from rank 0 every ``every`` optimizer steps (None: no lines).

    Example:
        >>> StepLog(None).every is None
        True
    """

    def __init__(self, every: int | None) -> None:
        self.every = every
        self._since = time.perf_counter()
        self._steps = 0  # since the last line
        self._epoch: int | None = None
        self._in_epoch = 0  # steps taken in this epoch (by this fit, when it resumed one)
        self._bar_shown = 0.0  # when the bar's metrics were last refreshed

    def step_done(
        self,
        step: int,
        progress: Any,
        epochs: int,
        total: int | None,
        metrics: Mapping[str, Any],
        bar: Any = None,
    ) -> None:
        """After every optimizer step; prints every ``every`` steps of the epoch.

        ``progress`` is the :class:`~ddpkit.train.progress.EpochProgress` of the running
        epoch, ``metrics`` the step's (this rank's), ``bar`` the epoch's progress bar.
        """
        self._show_on_bar(bar, metrics)
        if progress.epoch != self._epoch:
            self._epoch, self._in_epoch = progress.epoch, 0
        self._steps += 1
        self._in_epoch += 1
        if not self.every or self._in_epoch % self.every or not is_main():
            return
        now = time.perf_counter()
        pace = (now - self._since) / self._steps
        self._since, self._steps = now, 0
        where = f"{progress.batches}/{total}" if total is not None else str(progress.batches)
        shown = "".join(f"  {name} {float(value):.4f}" for name, value in metrics.items())
        print0(f"epoch {progress.epoch + 1}/{epochs}  batch {where}{shown}  ({pace:.3f} s/step)")

    def _show_on_bar(self, bar: Any, metrics: Mapping[str, Any]) -> None:
        if not isinstance(bar, tqdm) or bar.disable:
            return
        now = time.perf_counter()
        if now - self._bar_shown >= 0.5:
            self._bar_shown = now
            bar.set_postfix({name: f"{float(value):.4f}" for name, value in metrics.items()})
