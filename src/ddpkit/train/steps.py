"""The step contract: what a training or validation step receives and returns.

A step receives one batch, already on the rank's device (any structure, see
:mod:`ddpkit.data.batches`), and returns one of:

- a loss tensor (training: the Trainer calls ``backward()`` on it and steps the optimizers);
- a mapping of metrics, each a mean over the batch's samples: ``{"loss": loss, "accuracy":
  acc}``; the training step's ``"loss"`` is the one backpropagated, an optional
  ``"samples"`` says how many samples (or tokens) the means are over;
- None, from a training step that called ``trainer.backward`` and ``trainer.optimizer_step``
  itself (manual optimization, e.g. a GAN's two updates) and has nothing to report.

Every value is summed over ranks weighted by its sample count (:mod:`ddpkit.train.metrics`)
and shown in the epoch line. The default steps are the classifier's: a batch is ``(inputs,
targets)``, the loss is ``loss_fn(model(inputs), targets)``, and accuracy (and top-5 accuracy
with more than 5 classes) is reported.

Example:
    >>> import torch
    >>> result = read_step_output(torch.tensor(0.5), torch.zeros(4, 2), "training_step", True)
    >>> result.metrics, result.samples
    ({'loss': tensor(0.5000)}, 4)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ddpkit.data.batches import batch_size_of
from ddpkit.errors import ConfigError
from ddpkit.train.metrics import SAMPLES

StepOutput = torch.Tensor | Mapping[str, Any] | None
StepFn = Callable[[Any], StepOutput]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class StepResult:
    """A step's output, read: the loss to backpropagate, the metrics, their sample count.

    Example:
        >>> StepResult(loss=None).samples
        0
    """

    loss: torch.Tensor | None
    metrics: dict[str, Any] = field(default_factory=dict)
    samples: Any = 0


def read_step_output(
    output: StepOutput, batch: Any, step: str, needs_loss: bool = False
) -> StepResult:
    """Check and take apart what ``step`` returned (see the module docstring).

    ``needs_loss``: a loss to backpropagate must be there (the Trainer's own backward).

    Example:
        >>> import torch
        >>> read_step_output({"loss": torch.tensor(1.0), "samples": 7}, None, "step").samples
        7
        >>> read_step_output({"accuracy": 1.0}, torch.zeros(2), "training_step", True)
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: training_step returned a mapping without "loss" ...
    """
    if output is None:
        if needs_loss:
            raise ConfigError(
                f'{step} returned None: return the loss (or a dict with "loss"), or call '
                "trainer.backward(loss) and trainer.optimizer_step() in it yourself"
            )
        return StepResult(loss=None, samples=_count(batch))
    if isinstance(output, torch.Tensor):
        return StepResult(loss=output, metrics={"loss": output.detach()}, samples=_count(batch))
    if not isinstance(output, Mapping):
        raise ConfigError(
            f"{step} must return a loss tensor, a mapping of metrics or None; got a "
            f"{type(output).__name__}"
        )
    loss = output.get("loss")
    if needs_loss and loss is None:
        raise ConfigError(
            f'{step} returned a mapping without "loss" (keys: {", ".join(output)}); '
            'return the loss to backpropagate as "loss", or None if the step called '
            "trainer.backward() itself"
        )
    metrics = {k: _detached(v) for k, v in output.items() if k != SAMPLES}
    samples = output[SAMPLES] if SAMPLES in output else _count(batch)
    return StepResult(loss=loss, metrics=metrics, samples=samples)


def classifier_step(model: nn.Module, loss_fn: LossFn, batch: Any) -> dict[str, Any]:
    """The default step: ``loss_fn(model(inputs), targets)`` and the accuracies.

    Example:
        >>> import torch, torch.nn.functional as F
        >>> batch = (torch.tensor([[1.0, 0.0]]), torch.tensor([0]))
        >>> sorted(classifier_step(nn.Identity(), F.cross_entropy, batch))
        ['accuracy', 'loss']
    """
    inputs, targets = inputs_and_targets(batch)
    outputs = model(inputs)
    return {"loss": loss_fn(outputs, targets), **classifier_metrics(outputs.detach(), targets)}


def inputs_and_targets(batch: Any) -> tuple[Any, torch.Tensor]:
    """The two halves of a classifier's ``(inputs, targets)`` batch; others refused by name.

    Example:
        >>> import torch
        >>> inputs_and_targets([torch.zeros(2, 3), torch.ones(2)])[1]
        tensor([1., 1.])
    """
    if not (isinstance(batch, (list, tuple)) and len(batch) == 2):
        raise ConfigError(
            f"the default training step expects each batch to be (inputs, targets); got a "
            f"{type(batch).__name__}"
            + (f" of length {len(batch)}" if isinstance(batch, (list, tuple)) else "")
            + ". For other batches give the Trainer a training_step (see the README's "
            "'Your own step')"
        )
    return batch[0], batch[1]


def classifier_metrics(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Accuracy (and top-5 accuracy with more than 5 classes) when the outputs are a
    classifier's logits for class-index targets; else nothing.

    Example:
        >>> import torch
        >>> classifier_metrics(torch.tensor([[2.0, 1.0], [0.0, 1.0]]), torch.tensor([0, 0]))
        {'accuracy': tensor(0.5000, dtype=torch.float64)}
    """
    if not _is_classification(outputs, targets) or len(targets) == 0:
        return {}
    # In float64, so that mean x samples gives back the exact count of correct samples.
    correct = (outputs.argmax(dim=1) == targets).sum().double() / len(targets)
    if outputs.shape[1] <= 5:
        return {"accuracy": correct}
    in_top5 = (outputs.topk(5, dim=1).indices == targets[:, None]).any(dim=1)
    return {"accuracy": correct, "top5_accuracy": in_top5.sum().double() / len(targets)}


def _is_classification(outputs: torch.Tensor, targets: torch.Tensor) -> bool:
    return (
        isinstance(outputs, torch.Tensor)
        and isinstance(targets, torch.Tensor)
        and outputs.dim() == 2
        and targets.dim() == 1
        and not torch.is_floating_point(targets)
        and outputs.shape[0] == targets.shape[0]
    )


def _count(batch: Any) -> int:
    return batch_size_of(batch) if batch is not None else 1


def _detached(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value
