"""Step metrics summed over ranks: every value a sample-weighted mean over all ranks' samples.

A training or validation step returns its metrics as a mapping (``{"loss": ..., "accuracy":
...}``); each value is the mean over the step's samples. Each rank keeps running sums
``value * samples`` on its device, so the loop never waits for ``.item()``; at the end of the
epoch one exchange of the metric names and one all-reduce turn them into global means, equal
to what one process computes over the same samples. A step may say how many samples its
values are means over with a ``"samples"`` entry (for a language model, the number of
tokens); otherwise it is the batch's size.

The default classifier step (:mod:`ddpkit.train.steps`) reports ``loss``, ``accuracy`` and,
with more than 5 classes, ``top5_accuracy`` (the ImageNet tutorials' Acc@5).

Example:
    >>> sums = MetricSums(torch.device("cpu"))
    >>> sums.add({"loss": torch.tensor(0.5), "accuracy": 0.5}, samples=2)
    >>> sums.add({"loss": torch.tensor(2.0), "accuracy": 1.0}, samples=1)
    >>> sums.reduce()
    {'loss': 1.0, 'samples': 3.0, 'accuracy': 0.6666666666666666}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ddpkit.errors import ConfigError
from ddpkit.runtime.collectives import all_gather_rows, all_reduce_sum

SAMPLES = "samples"  # the count the step's means are over, and the total in the results


class MetricSums:
    """Per-rank running sums of ``value * samples`` by metric name, on the device.

    Example:
        >>> MetricSums(torch.device("cpu")).reduce()  # nothing added
        {}
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.names: list[str] = []  # in the order they first appeared
        self.sums = torch.zeros(1, dtype=torch.float64, device=device)  # [samples, *names]

    def add(self, values: Mapping[str, Any], samples: int | float | torch.Tensor) -> None:
        """Add one step's means (tensors or numbers), each over ``samples`` samples.

        Example:
            >>> sums = MetricSums(torch.device("cpu"))
            >>> sums.add({"loss": torch.tensor(0.25)}, samples=4)
            >>> sums.sums.tolist()  # samples, loss * samples
            [4.0, 1.0]
        """
        if list(values) != self.names:
            self._make_room(values)
        weight = self._as_double(samples)
        self.sums[0] += weight
        if self.names:
            row = torch.stack([self._as_double(values.get(name, 0.0)) for name in self.names])
            self.sums[1:] += row * weight

    def reduce(self) -> dict[str, float]:
        """Global means over every rank's samples (a collective: all ranks call it).

        ``samples`` is the total count. Ranks that saw different metric names (one had no
        batch) agree on the union first.

        Example:
            >>> sums = MetricSums(torch.device("cpu"))
            >>> sums.add({"loss": 0.5}, samples=2)
            >>> sums.reduce()  # a world of one: these are the global means
            {'loss': 0.5, 'samples': 2.0}
        """
        names, totals = self.reduced_sums()
        count = totals[0]
        if count == 0:
            return {}
        means = {name: total / count for name, total in zip(names, totals[1:], strict=True)}
        first = {name: means.pop(name) for name in names[:1]}  # "loss" leads, as it always did
        return {**first, SAMPLES: count, **means}

    def reduced_sums(self) -> tuple[list[str], list[float]]:
        """The names all ranks agreed on and the summed ``[samples, *sums]`` (a collective).

        Example:
            >>> sums = MetricSums(torch.device("cpu"))
            >>> sums.add({"loss": 1.0}, samples=3)
            >>> sums.reduced_sums()
            (['loss'], [3.0, 3.0])
        """
        names = agreed_names(self.names)
        return names, all_reduce_sum(self.aligned(names)).tolist()

    def aligned(self, names: list[str]) -> torch.Tensor:
        """This rank's sums in the order of ``names`` (zero for names it never saw)."""
        position = {name: i + 1 for i, name in enumerate(self.names)}
        rows = [self.sums[0]] + [
            self.sums[position[n]] if n in position else self.sums.new_zeros(()) for n in names
        ]
        return torch.stack(rows)

    def load(self, names: list[str], sums: torch.Tensor) -> None:
        """Add saved ``[samples, *sums]`` for ``names`` (a resumed epoch's totals so far)."""
        self._make_room(dict.fromkeys(names))
        saved = sums.to(self.sums)
        self.sums[0] += saved[0]
        for i, name in enumerate(names):
            self.sums[self.names.index(name) + 1] += saved[i + 1]

    def _make_room(self, values: Mapping[str, Any]) -> None:
        for name in values:
            if not isinstance(name, str):
                raise ConfigError(f"metric names must be strings; got {name!r}")
            if name not in self.names and name != SAMPLES:
                self.names.append(name)
                self.sums = torch.cat([self.sums, self.sums.new_zeros(1)])

    def _as_double(self, value: Any) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ConfigError(
                    f"a step's metric must be one number (a mean); got a tensor of shape "
                    f"{list(value.shape)}: reduce it first, e.g. with .mean()"
                )
            return value.detach().reshape(()).to(self.device, torch.float64)
        return torch.tensor(float(value), dtype=torch.float64, device=self.device)


def agreed_names(mine: list[str]) -> list[str]:
    """The union of every rank's metric names, in rank 0's order then the others' (a
    collective; in a world of one, ``mine``).

    Example:
        >>> agreed_names(["loss", "accuracy"])
        ['loss', 'accuracy']
    """
    encoded = torch.tensor(list("\n".join(mine).encode()), dtype=torch.uint8)
    union: list[str] = []
    for rows in all_gather_rows(encoded):
        for name in bytes(rows.tolist()).decode().split("\n"):
            if name and name not in union:
                union.append(name)
    return union


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
