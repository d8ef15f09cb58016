"""What the training loop shows as it runs: tqdm's bar on a terminal, a line every N steps.

The bar hides itself when stderr is not a terminal (CI logs, pipes, ``ddpkit run``'s
workers), which is where a line every ``log_every`` optimizer steps helps: epoch, batch,
rank 0's loss on its latest batch and the pace, as the ImageNet tutorials' ``--print-freq``
shows it. Only rank 0 prints, and only its loss is read (one ``.item()`` per line).

Example:
    >>> import torch, types
    >>> log = StepLog(every=2)
    >>> at = types.SimpleNamespace(epoch=0, batches=2)  # an EpochProgress: epoch 1, 2 batches
    >>> log.step_done(1, at, epochs=3, total=5, loss=torch.tensor(0.5))  # first step: quiet
    >>> log.step_done(2, at, epochs=3, total=5, loss=torch.tensor(0.75))  # doctest: +ELLIPSIS
    epoch 1/3  batch 2/5  loss 0.7500  (... s/step)
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch
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

    def step_done(
        self, step: int, progress: Any, epochs: int, total: int | None, loss: torch.Tensor
    ) -> None:
        """After every optimizer step; prints every ``every`` steps of the epoch.

        ``progress`` is the :class:`~ddpkit.train.progress.EpochProgress` of the running epoch.
        """
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
        print0(f"epoch {progress.epoch + 1}/{epochs}  batch {where}  loss {loss.item():.4f}  "
               f"({pace:.3f} s/step)")  # fmt: skip
