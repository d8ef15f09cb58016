"""Evaluation, once for both faces: a step's metrics over every rank's shard, exact.

``TrainLoop.evaluate(loader, step)`` and ``Trainer.evaluate(loader)`` both run
:func:`evaluate`: without gradients, every model in eval mode (then back to the mode it was
in), each batch under the run's precision and timed by the hang watchdog as an evaluation
phase. DistributedSampler evens out the shards by repeating samples; those repeats are left
out of the metrics, so N ranks report what one process computes over the dataset. Every rank
still runs every batch, a batch of padding only included: FSDP's forward gathers parameters
and DDP's may broadcast buffers, so no rank may skip one.

Example:
    >>> import contextlib, torch
    >>> from ddpkit.train.monitor import StepMonitor
    >>> from ddpkit.runtime.callbacks import Events
    >>> model = torch.nn.Linear(2, 1)
    >>> parts = EvaluationParts(torch.device("cpu"), StepMonitor(model, None, Events()),
    ...                         contextlib.nullcontext, {"model": model})
    >>> data = [(torch.ones(4, 2), torch.zeros(4, 1))]
    >>> step = lambda b: {"mse": torch.nn.functional.mse_loss(model(b[0]), b[1])}
    >>> sorted(evaluate(data, step, parts))
    ['mse', 'samples']
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ddpkit.data.batches import batch_size_of, slice_batch, to_device
from ddpkit.data.loader import real_samples_on_rank
from ddpkit.runtime.position import FORWARD
from ddpkit.train.monitor import StepMonitor
from ddpkit.train.steps import MetricSums, StepOutput, read_step_output


@dataclass(frozen=True)
class EvaluationParts:
    """What an evaluation runs with: the loop's device, monitor, autocast and models by name."""

    device: torch.device
    monitor: StepMonitor
    autocast: Callable[[], contextlib.AbstractContextManager[Any]]
    models: Mapping[str, nn.Module]


@torch.no_grad()
def evaluate(
    loader: Iterable[Any], step: Callable[[Any], StepOutput], parts: EvaluationParts
) -> dict[str, float]:
    """``step``'s metrics (each a mean over its batch) averaged over every rank's real
    samples: a collective, every rank calls it. ``samples`` is their count."""
    sums = MetricSums(parts.device)
    remaining = real_samples_on_rank(loader)  # padded duplicates are not counted
    with _eval_mode(parts.models.values()), parts.monitor.ending():
        for batch in parts.monitor.batches(loader, evaluation=True):
            batch = to_device(batch, parts.device)
            size = batch_size_of(batch)
            keep = size if remaining is None else max(0, min(size, remaining))
            remaining = None if remaining is None else remaining - keep
            parts.monitor.stage(FORWARD)
            part = slice_batch(batch, keep) if 0 < keep < size else batch
            with parts.autocast():
                output = step(part)
            if keep:
                result = read_step_output(output, part, "validation_step")
                sums.add(result.metrics, result.samples)
    return sums.reduce()


@contextlib.contextmanager
def _eval_mode(models: Iterable[nn.Module]) -> Iterator[None]:
    """Every module in eval mode; afterwards each back to the mode it was in."""
    models = list(models)
    modes = [(m, m.training) for model in models for m in model.modules()]
    for model in models:
        model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training
