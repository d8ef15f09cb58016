"""The step contract: what a step receives and returns, and how its metrics add up over ranks.

A step receives one batch, already on the rank's device (any structure, see
:mod:`ddpkit.data.batches`), and returns one of:

- a loss tensor (training: the loop calls ``backward()`` on it and steps the optimizers);
- a mapping of metrics, each a mean over the batch's samples: ``{"loss": loss, "accuracy":
  acc}``; the training step's ``"loss"`` is the one backpropagated, an optional
  ``"samples"`` says how many samples (or tokens) the means are over;
- None, from a training step that called ``trainer.backward`` and ``trainer.optimizer_step``
  itself (manual optimization, e.g. a GAN's two updates) and has nothing to report.

Each rank sums ``value * samples`` on its device (:class:`MetricSums`, no ``.item()`` per
step); at the epoch's end one all-gather (the one that shares the ranks' step times) makes
them the global means one process computes.
The default steps are the classifier's: ``loss_fn(model(inputs), targets)``, accuracy, and
top-5 accuracy with more than 5 classes (the ImageNet tutorials' Acc@5).

Example:
    >>> result = read_step_output(torch.tensor(0.5), torch.zeros(4, 2), "training_step", True)
    >>> sums = MetricSums(torch.device("cpu"))
    >>> sums.add(result.metrics, result.samples)
    >>> sums.add({"loss": torch.tensor(2.0)}, samples=1)
    >>> sums.reduce()
    {'loss': 0.8, 'samples': 5.0}
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ddpkit.data.batches import batch_size_of
from ddpkit.errors import ConfigError
from ddpkit.runtime.collectives import all_gather_rows, all_gather_same, all_reduce_sum

SAMPLES = "samples"  # the count the step's means are over, and the total in the results


class MetricSums:
    """Per-rank running sums of ``value * samples`` by metric name, on the device.

    Example:
        >>> MetricSums(torch.device("cpu")).reduce()  # nothing added
        {}
    """

    def __init__(self, device: torch.device, agreed: list[str] | None = None) -> None:
        self.device = device
        self.names: list[str] = []  # in the order they first appeared
        # The names every rank agreed on at the last reduction (the previous epoch's): the
        # same list on every rank, since only a collective's result changes it.
        self.agreed: list[str] = list(agreed or [])
        self._sums = torch.zeros(1, dtype=torch.float64, device=device)  # [samples, *names]
        self._pending: list[tuple[Any, ...]] = []  # (samples, *values) of batches not folded
        self._plain = 0  # the waiting rows made plain numbers (a snapshot's), from the first

    @property
    def sums(self) -> torch.Tensor:
        """``[samples, *value * samples]`` so far, one entry per name."""
        self._fold()
        return self._sums

    def local_state(self) -> dict[str, Any]:
        """This rank's sums as they stand, with no collective: a memory snapshot's, every
        step. The batches waiting to be added come as plain numbers when they are on the
        CPU (reading one there waits for nothing, and a run resumed from them adds them in
        the same groups as one never stopped); on a GPU they are folded in first (a few ops
        on the device; reading each would wait for it), so a run with snapshots adds its
        sums in other groups than one without: the same to about 1e-16.

        Example:
            >>> sums = MetricSums(torch.device("cpu"))
            >>> sums.add({"loss": torch.tensor(0.5)}, samples=2)
            >>> again = MetricSums(torch.device("cpu"))
            >>> again.load_local_state(sums.local_state())
            >>> again.sums.tolist()
            [2.0, 1.0]
        """
        if not self._pending_as_numbers():
            self._fold()
        return {"names": list(self.names), "sums": self._sums, "pending": _packed(self._pending)}

    def load_local_state(self, state: Mapping[str, Any]) -> None:
        """Put back :meth:`local_state` output (of this rank, at the same world size)."""
        self.names = list(state["names"])
        self._sums = state["sums"].to(self.device, copy=True)
        self._pending = _unpacked(state.get("pending"))
        self._plain = len(self._pending)

    def _pending_as_numbers(self) -> bool:
        """The waiting rows' values made plain numbers, when all are on the CPU (False:
        some are on a device, left as they are). The same values: a CPU tensor's number is
        exact in float64, as its stack converted to float64 is."""
        plain = self._plain
        if plain == len(self._pending):  # most steps: one row more since the last time
            return True
        rows = self._pending[plain:]
        if any(isinstance(v, torch.Tensor) and not _on_cpu(v) for row in rows for v in row):
            return False
        self._pending[plain:] = [tuple(map(_as_number, row)) for row in rows]
        self._plain = len(self._pending)
        return True

    def add(self, values: Mapping[str, Any], samples: int | float | torch.Tensor) -> None:
        """Add one step's means (tensors or numbers), each over ``samples`` samples.

        Example:
            >>> sums = MetricSums(torch.device("cpu"))
            >>> sums.add({"loss": torch.tensor(0.25)}, samples=4)
            >>> sums.sums.tolist()  # samples, loss * samples
            [4.0, 1.0]
        """
        count = float(samples) if type(samples) is int else _one_number(samples)
        if list(values) == self.names:  # the names as last time (most steps): in order
            self._pending.append((count, *map(_one_number, values.values())))
        else:
            self._make_room(values)
            row = [_one_number(values.get(name, 0.0)) for name in self.names]
            self._pending.append((count, *row))
        if len(self._pending) >= _FOLD_EVERY:
            self._fold()

    def reduce(self, rows: torch.Tensor | None = None) -> dict[str, float]:
        """Global means over every rank's samples (a collective: all ranks call it).

        ``samples`` is the total count. Ranks that saw different metric names (one had no
        batch) agree on the union first. ``rows``: every rank's :meth:`local_row`, already
        gathered with something else (the epoch's step times).

        Example:
            >>> sums = MetricSums(torch.device("cpu"))
            >>> sums.add({"loss": 0.5}, samples=2)
            >>> sums.reduce()  # a world of one: these are the global means
            {'loss': 0.5, 'samples': 2.0}
        """
        names, totals = self.reduced_sums(rows)
        count = totals[0]
        if count == 0:
            return {}
        means = {name: total / count for name, total in zip(names, totals[1:], strict=True)}
        first = {name: means.pop(name) for name in names[:1]}  # "loss" leads, as it always did
        return {**first, SAMPLES: count, **means}

    def local_row(self) -> torch.Tensor:
        """This rank's part of the reduction, on the CPU: its ``[samples, *sums]`` in the
        order of the names agreed last time, then a flag, 1 when its own names are not those
        (or nothing is agreed yet).

        Example:
            >>> sums = MetricSums(torch.device("cpu"), agreed=["loss"])
            >>> sums.add({"loss": 1.0}, samples=2)
            >>> sums.local_row().tolist()
            [2.0, 2.0, 0.0]
        """
        if self.agreed and self.names == self.agreed:  # most epochs: the sums, then flag 0
            return torch.cat([self.sums.cpu(), torch.zeros(1, dtype=torch.float64)])
        differs = float(not self.agreed or set(self.names) != set(self.agreed))
        return torch.cat([self.aligned(self.agreed).cpu(), torch.tensor([differs]).double()])

    def reduced_sums(self, rows: torch.Tensor | None = None) -> tuple[list[str], list[float]]:
        """The names all ranks agreed on and the summed ``[samples, *sums]`` (a collective).

        Every rank's :meth:`local_row` is gathered (``rows``: gathered already), in one
        all-gather, and summed here in rank order: that is the result when every rank has
        the names agreed on last time (an epoch like the one before). When one has not, or
        nothing is agreed yet, the ranks agree on the union of their names first (two
        all-gathers) and all-reduce their sums in its order.

        Example:
            >>> sums = MetricSums(torch.device("cpu"))
            >>> sums.add({"loss": 1.0}, samples=3)
            >>> sums.reduced_sums()
            (['loss'], [3.0, 3.0])
        """
        # A gathered row summed here, not an all-reduce: gloo's all-reduce of a few numbers
        # took 0.3-1.2 ms on 2 CPU workers, an all-gather 0.3-0.5 (and the epoch's step
        # times are gathered anyway: rows come with them).
        rows = all_gather_same(self.local_row()) if rows is None else rows
        *totals, differ = rows.sum(dim=0).tolist()
        if not differ:  # the same rows on every rank: every rank takes this branch, or none
            return list(self.agreed), totals
        self.agreed = agreed_names(self.names)
        return list(self.agreed), all_reduce_sum(self.aligned(self.agreed)).tolist()

    def aligned(self, names: list[str]) -> torch.Tensor:
        """This rank's sums in the order of ``names`` (zero for names it never saw)."""
        sums, position = self.sums, {name: i + 1 for i, name in enumerate(self.names)}
        rows = [sums[0]] + [
            sums[position[n]] if n in position else sums.new_zeros(()) for n in names
        ]
        return torch.stack(rows)

    def load(self, names: list[str], sums: torch.Tensor) -> None:
        """Add saved ``[samples, *sums]`` for ``names`` (a resumed epoch's totals so far)."""
        self._make_room(dict.fromkeys(names))
        saved = sums.to(self._sums)
        self._sums[0] += saved[0]
        for i, name in enumerate(names):
            self._sums[self.names.index(name) + 1] += saved[i + 1]

    def _make_room(self, values: Mapping[str, Any]) -> None:
        self._fold()  # the waiting rows have the old names
        for name in values:
            if not isinstance(name, str):
                raise ConfigError(f"metric names must be strings; got {name!r}")
            if name not in self.names and name != SAMPLES:
                self.names.append(name)
                self._sums = torch.cat([self._sums, self._sums.new_zeros(1)])

    def _fold(self) -> None:
        """Add the waiting batches to the sums: one stack per column, not ops per batch."""
        if not self._pending:
            return
        block = torch.stack([self._column(c) for c in zip(*self._pending, strict=True)])
        self._pending, self._plain = [], 0
        self._sums[0] += block[0].sum()
        if len(block) > 1:
            self._sums[1:] += (block[1:] * block[0]).sum(dim=1)

    def _column(self, values: tuple[Any, ...]) -> torch.Tensor:
        """One metric's values over the waiting batches, as float64 on the device."""
        if not any(isinstance(v, torch.Tensor) for v in values):
            return torch.tensor(values, dtype=torch.float64, device=self.device)
        parts = [v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.float64)
                 for v in values]  # fmt: skip
        if len({(p.dtype, p.device) for p in parts}) > 1:  # mixed: convert each, rarely
            parts = [p.to(self.device, torch.float64) for p in parts]
        return torch.stack(parts).to(self.device, torch.float64)


_FOLD_EVERY = 64  # batches whose values wait before they are added to the sums


def _one_number(value: Any) -> Any:
    """A metric value as a 0-dim tensor (not waited for) or a float; anything else refused."""
    if isinstance(value, torch.Tensor):
        if value.dim():  # 0-dim (a loss, a mean) needs no check: one torch call, not three
            if value.numel() != 1:
                raise ConfigError(
                    f"a step's metric must be one number (a mean); got a tensor of shape "
                    f"{list(value.shape)}: reduce it first, e.g. with .mean()"
                )
            value = value.reshape(())
        return value.detach() if value.requires_grad else value
    return float(value)


def _packed(rows: list[tuple[Any, ...]]) -> tuple[int, bytes]:
    """Rows of plain numbers as their width and float64 bytes: one value to walk and
    pickle, not one per number (exact: a count or a float32 mean is one in float64)."""
    width = len(rows[0]) if rows else 0
    return width, array.array("d", itertools.chain.from_iterable(rows)).tobytes()


def _unpacked(packed: tuple[int, bytes] | None) -> list[tuple[Any, ...]]:
    if not packed or not packed[0]:
        return []
    width, raw = packed
    values = array.array("d", raw).tolist()
    return [tuple(values[i : i + width]) for i in range(0, len(values), width)]


def _on_cpu(tensor: torch.Tensor) -> bool:
    """A plain tensor in the CPU's memory (a DTensor, say, is folded as it is)."""
    return type(tensor) is torch.Tensor and tensor.device.type == "cpu"


def _as_number(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) else value


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
