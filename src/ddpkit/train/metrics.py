"""Training metrics summed over ranks: sample-weighted loss and, for classifiers, accuracy.

Each rank keeps running sums ``(loss * n, n, correct, correct in top 5)`` on its device, so the
loop never waits for ``.item()``; one all-reduce at the end of the epoch turns them into
global means that equal what one process computes over the same samples. Top-5 accuracy (the
ImageNet tutorials' Acc@5) is reported for classifiers with more than 5 classes.

Example:
    >>> sums = MetricSums(torch.device("cpu"))
    >>> sums.add(torch.tensor(0.5), torch.tensor([[2.0, 1.0], [0.0, 1.0]]), torch.tensor([0, 0]))
    >>> sums.reduce()
    {'loss': 0.5, 'samples': 2.0, 'accuracy': 0.5}
"""

from __future__ import annotations

import torch

from ddpkit.data.loader import batch_size_of
from ddpkit.runtime.collectives import all_reduce_sum


class MetricSums:
    """Per-rank running sums, kept on the device so the loop never waits for ``.item()``.

    Example:
        >>> MetricSums(torch.device("cpu")).reduce()  # nothing added
        {}
    """

    def __init__(self, device: torch.device) -> None:
        # loss*n, n, correct, correct within the top 5
        self.sums = torch.zeros(4, dtype=torch.float64, device=device)
        self.classifier: bool | None = None
        self.top5 = False

    def add(self, loss: torch.Tensor, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        """Add one batch; ``loss`` is the batch mean, as torch's losses return by default.

        Example:
            >>> sums = MetricSums(torch.device("cpu"))
            >>> sums.add(torch.tensor(0.2), torch.tensor([[0.9, 0.1]]), torch.tensor([0]))
            >>> sums.sums.tolist()  # loss*n, n, correct, top-5 correct
            [0.2..., 1.0, 1.0, 0.0]
        """
        n = batch_size_of(targets)
        if self.classifier is None:
            self.classifier = _is_classification(outputs, targets)
            self.top5 = self.classifier and outputs.shape[1] > 5
        self.sums[0] += loss.double() * n
        self.sums[1] += n
        if self.classifier:
            self.sums[2] += (outputs.argmax(dim=1) == targets).sum()
            if outputs.shape[1] > 5:
                top5 = outputs.topk(5, dim=1).indices
                self.sums[3] += (top5 == targets[:, None]).any(dim=1).sum()

    def reduce(self) -> dict[str, float]:
        """Global means over every rank's samples (a collective: all ranks call it).

        Example:
            >>> sums = MetricSums(torch.device("cpu"))
            >>> outputs = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
            >>> sums.add(torch.tensor(0.5), outputs, torch.tensor([0, 0]))
            >>> sums.reduce()  # a world of one: these are the global means
            {'loss': 0.5, 'samples': 2.0, 'accuracy': 0.5}
        """
        loss_sum, count, correct, correct5 = all_reduce_sum(self.sums).tolist()
        if count == 0:
            return {}
        metrics = {"loss": loss_sum / count, "samples": count}
        if self.classifier:
            metrics["accuracy"] = correct / count
            if self.top5:
                metrics["top5_accuracy"] = correct5 / count
        return metrics


def _is_classification(outputs: torch.Tensor, targets: torch.Tensor) -> bool:
    return (
        outputs.dim() == 2
        and targets.dim() == 1
        and not torch.is_floating_point(targets)
        and outputs.shape[0] == targets.shape[0]
    )


def format_epoch(metrics: dict[str, float], epochs: int) -> str:
    """One log line for an epoch's metrics.

    Example:
        >>> format_epoch({"epoch": 1.0, "loss": 0.5, "samples": 8.0, "time_s": 1.25}, 10)
        'epoch 1/10  loss 0.5000  (1.25 s)'
    """
    parts = [f"epoch {int(metrics['epoch'])}/{epochs}"]
    shown = {k: v for k, v in metrics.items() if k not in ("epoch", "time_s")}
    parts += [f"{k} {v:.4f}" for k, v in shown.items() if not k.endswith("samples")]
    parts.append(f"({metrics['time_s']:.2f} s)")
    return "  ".join(parts)
