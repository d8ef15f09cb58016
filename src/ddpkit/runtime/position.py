"""Where the training thread's loop stands, for the hang watchdog: written, never told.

The loop moves through four stages a batch (loading it, its forward or the loop's body, its
backward, the optimizer step). Telling the watchdog of each was two Python calls a stage,
about 3.5 us each in a GPT-2 step's cold caches (benchmarks/loop_parts.py); instead the loop
writes the stage, the step and when the batch was requested into a :class:`TrainingPosition`
(plain attribute writes, no call), and the watchdog reads it only when it looks (every poll,
and for a report). A collective or a ``watch()`` block inside a step is still timed on its
own (``Watchdog.begin``/``end``); when none is running, the position is what the rank does.

Example:
    >>> position = TrainingPosition()
    >>> position.step, position.stage, position.since = 3, BACKWARD, 12.5
    >>> position.activity()
    ('step 3: backward', 12.5)
"""

from __future__ import annotations

import time
from typing import NamedTuple


class Stage(NamedTuple):
    """A stage of a batch: its order within the batch (the watchdog's progress count) and
    what the hang report calls it.

    Example:
        >>> OPTIMIZER_STEP.order, OPTIMIZER_STEP.name
        (3, 'optimizer step')
    """

    order: int
    name: str


STAGES_PER_BATCH = 4
LOADING = Stage(0, "loading the batch")
LOOP_BODY = Stage(1, "the loop body")  # a hand-written loop's: forward and its own code
FORWARD = Stage(1, "forward")  # the Trainer's
BACKWARD = Stage(2, "backward")
OPTIMIZER_STEP = Stage(3, "optimizer step")


def backward_stage(final: bool, world_size: int) -> Stage:
    """The backward stage as the report names it: whether it carries the gradient all-reduce.

    Example:
        >>> backward_stage(final=True, world_size=2).name
        'backward + gradient all-reduce'
        >>> backward_stage(final=False, world_size=2).name
        'backward (no sync)'
    """
    if world_size == 1:
        return BACKWARD
    return Stage(2, "backward + gradient all-reduce" if final else "backward (no sync)")


class TrainingPosition:
    """The training loop's step, stage and batch start (``since``, ``time.monotonic()``;
    None between batches), and how many batches it requested; ``evaluating``: the batches
    are an evaluation's. The loop writes the attributes; the watchdog's thread reads them
    (a torn read pairs a stage with its neighbour's start: the report is off by a stage).

    Example:
        >>> position = TrainingPosition()
        >>> position.activity() is None, position.progress()
        (True, 0)
    """

    __slots__ = ("batches", "ended_at", "evaluating", "last", "since", "stage", "step")

    def __init__(self) -> None:
        self.step = 0
        self.stage = LOADING
        self.since: float | None = None
        self.batches = 0
        self.evaluating = False
        self.last: str | None = None  # the label of the last batch, once none is running
        self.ended_at = 0.0  # when it ended (time.monotonic())

    def label(self) -> str:
        """``step 3: backward`` or ``evaluation: forward``."""
        where = "evaluation" if self.evaluating else f"step {self.step}"
        return f"{where}: {self.stage.name}"

    def activity(self) -> tuple[str, float] | None:
        """The batch running (its label, its start), or None."""
        since = self.since
        return None if since is None else (self.label(), since)

    def progress(self) -> int:
        """Stages entered (equal on ranks in step): the hang report's who-is-behind count."""
        return self.batches * STAGES_PER_BATCH + self.stage.order

    def idle(self) -> None:
        """No batch runs now (the loader ran out, or the loop was left)."""
        if self.since is not None:
            self.last, self.ended_at = self.label(), time.monotonic()
        self.since = None
