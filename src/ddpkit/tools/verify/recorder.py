"""What ``ddpkit verify`` records inside the script it runs, as a callback of training.

``ddpkit verify`` runs the unchanged script twice, as N workers and as one process standing in
for them (see :func:`ddpkit.runtime.session.reference_world_size`), with ``DDPKIT_VERIFY_DIR`` set
and :func:`install` named in ``DDPKIT_WORKER_SETUP``: each worker registers a :class:`Recorder`
callback for every run of the process before the script starts
(:func:`ddpkit.runtime.callbacks.register_callback`; no library module imports this one). It
hears the hooks every callback hears, from the Trainer and a hand-written loop alike. The
recorder notes, in each run: every rank's weights and random-generator state when
``prepare_model`` is called (before DDP broadcasts rank 0's weights and hides a difference), the
parameters before the first step and after the last, which samples each rank trained on and a
fingerprint of each, the sampler's coverage of the first epoch, the replica checks, and the
model's layers that make runs differ by design (BatchNorm, Dropout). Rank 0 writes
``record.json`` and ``params.pt`` (tensors only); verify compares the two runs.

Example:
    >>> Recorder(Path("/tmp/verify-run")).finished
    False
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ddpkit._core.protocol import VERIFY_DIR_ENV
from ddpkit.data.batches import batch_size_of, tensor_leaves
from ddpkit.data.coverage import listable, sampler_coverage
from ddpkit.parallel.replicas import fingerprint
from ddpkit.parallel.strategy import strategy_of
from ddpkit.runtime.callbacks import Callback, RunView, register_callback
from ddpkit.runtime.collectives import all_gather_rows, is_main
from ddpkit.runtime.session import current_world, reference_world_size

RECORD_FILE = "record.json"
PARAMS_FILE = "params.pt"
_MAX_SAMPLES = 4096  # fingerprinted samples per rank: enough to tell, small to gather


def install() -> Recorder:
    """The worker setup ``ddpkit verify`` names in ``DDPKIT_WORKER_SETUP``: record this run.

    Registers a :class:`Recorder` writing to ``DDPKIT_VERIFY_DIR`` as a callback of every
    training run (:mod:`ddpkit.runtime.callbacks`), before the script starts.

    Example::

        DDPKIT_WORKER_SETUP=ddpkit.tools.verify.recorder:install DDPKIT_VERIFY_DIR=/tmp/v \\
            python -m ddpkit.launch.worker train.py
    """
    return register_callback(Recorder(Path(os.environ[VERIFY_DIR_ENV])))


class Recorder(Callback):
    """Collects one run's facts for ``ddpkit verify``; rank 0 writes them at the end.

    Example:
        >>> Recorder(Path("/tmp/verify-run")).finished
        False
    """

    rank_zero_only = False  # every rank records; the gathers are collectives

    def __init__(self, out: Path) -> None:
        self.out = out
        self.finished = False
        self.build: dict[str, list[int]] = {}
        self.setup: dict[str, Any] = {}
        self.coverage: dict[str, Any] | None = None
        self.replicas: dict[str, Any] = {"checked": [], "divergence": None}
        self._initial: dict[str, torch.Tensor] = {}
        self._samples: list[list[int]] = []  # [index, inputs hash, targets hash]
        self._epoch_order: list[int] = []
        self._position = 0

    def on_model_built(self, model: nn.Module) -> None:
        """Every rank's weights and RNG state as ``prepare_model`` received them."""
        mine = torch.tensor([[_weights_fingerprint(model), _rng_fingerprint()]])
        rows = torch.cat(all_gather_rows(mine)).tolist()
        self.build = {"weights": [r[0] for r in rows], "rng": [r[1] for r in rows]}

    def on_fit_start(self, trainer: RunView) -> None:
        """The set-up and the parameters before the first step."""
        setup = trainer.setup.record() if trainer.setup is not None else {}
        self.setup = {**setup, **model_notes(trainer.model)}
        self._initial = full_state(trainer.model)

    def on_train_epoch_start(self, trainer: RunView, epoch: int) -> None:
        """Check the first epoch's coverage; note this epoch's sample order."""
        loader = trainer.loader
        if self.coverage is None:
            self.coverage = sampler_coverage(loader)
        sampler = getattr(loader, "sampler", None)
        self._epoch_order = list(sampler) if listable(sampler) else []  # type: ignore[arg-type]
        self._position = 0

    def on_train_batch_start(self, trainer: RunView, batch: Any) -> None:
        """Fingerprint each sample of a batch, by dataset index: its first tensor (the
        inputs) and the rest (targets, masks...), whatever the batch's structure."""
        n = batch_size_of(batch)
        dealt = getattr(trainer.loader, "dealt", None)  # a loader that says (ReplicaBatches)
        indices = list(dealt) if dealt is not None else (
            self._epoch_order[self._position : self._position + n])  # fmt: skip
        self._position += n
        if len(indices) != n or len(self._samples) >= _MAX_SAMPLES:
            return
        per_sample = [t for t in tensor_leaves(batch) if t.dim() and t.shape[0] == n]
        first, rest = per_sample[0], per_sample[1:]
        for row, index in enumerate(indices):
            others = sum(fingerprint(t[row]) for t in rest) % (1 << 63)
            self._samples.append([index, fingerprint(first[row]), others])

    def on_replicas_checked(
        self, trainer: Any, step: int, divergence: Mapping[str, Any] | None
    ) -> bool:
        """Note a replica check; keep the first divergence (verify reports it, training goes on)."""
        self.replicas["checked"].append(step)
        if divergence is not None and self.replicas["divergence"] is None:
            self.replicas["divergence"] = dict(divergence)
        return True

    def on_fit_end(self, trainer: RunView) -> None:
        """Gather and write the record (a collective; rank 0 writes). Only the first call."""
        if self.finished:
            return
        self.finished = True
        final = full_state(trainer.model)
        samples = _gather_samples(self._samples)
        if is_main():
            self._write(trainer.step, final, samples)

    def _write(self, steps: int, final: dict[str, torch.Tensor], samples: dict[str, Any]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        torch.save({"initial": self._initial, "final": final}, self.out / PARAMS_FILE)
        record = {
            "world_size": current_world().world_size,
            "reference_for": reference_world_size(),
            "steps": steps,
            "setup": self.setup,
            "build": self.build,
            "coverage": self.coverage,
            "replicas": self.replicas,
            "samples": samples,
        }
        (self.out / RECORD_FILE).write_text(json.dumps(record, indent=1))


def model_notes(model: nn.Module) -> dict[str, Any]:
    """Layers that make N ranks differ from one process by design, and the determinism flag.

    Example:
        >>> model_notes(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)))["dropout"]
        ['1']
    """
    module = strategy_of(model).unwrap(model)
    batchnorm, dropout = [], []
    for name, layer in module.named_modules():
        synced = isinstance(layer, nn.SyncBatchNorm)
        if isinstance(layer, nn.modules.batchnorm._BatchNorm) and not synced:
            batchnorm.append(name)
        if isinstance(layer, nn.modules.dropout._DropoutNd) and layer.p > 0:
            dropout.append(name)
    return {
        "batchnorm": batchnorm,
        "dropout": dropout,
        "strategy": strategy_of(model).name,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state on CPU (under FSDP a collective that gathers it).

    Example:
        >>> sorted(full_state(nn.Linear(2, 1)))
        ['bias', 'weight']
    """
    return strategy_of(model).full_state(model)


def _weights_fingerprint(model: nn.Module) -> int:
    # A model on the meta device has no values yet: its weights come from a file, alike.
    return sum(fingerprint(p) for p in model.parameters() if not p.is_meta) % (1 << 63)


def _rng_fingerprint() -> int:
    return fingerprint(torch.get_rng_state())


def _gather_samples(samples: list[list[int]]) -> dict[str, list[int]]:
    mine = torch.tensor(samples, dtype=torch.int64).reshape(-1, 3)
    rows = torch.cat(all_gather_rows(mine)).tolist()
    found: dict[str, list[int]] = {}
    for index, inputs_hash, targets_hash in rows:
        found.setdefault(str(index), [inputs_hash, targets_hash])
    return found
