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
model's layers that make runs differ by design (BatchNorm, Dropout). Each rank appends its
samples to a file of its own as it trains (a process killed mid-run keeps what it trained;
``DDPKIT_VERIFY_KILL_AT``: the last rank of a replica group kills itself with SIGKILL after
that step, in its first start only); at the end rank 0 reads them all and writes
``record.json`` and ``params.pt`` (tensors only); verify compares the two runs.

Example:
    >>> Recorder(Path("/tmp/verify-run")).finished
    False
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ddpkit._core.protocol import KILL_AT_ENV, VERIFY_DIR_ENV
from ddpkit.data.batches import batch_size_of, tensor_leaves
from ddpkit.data.coverage import listable, sampler_coverage
from ddpkit.parallel.replicas import fingerprint
from ddpkit.parallel.strategy import strategy_of
from ddpkit.runtime.callbacks import Callback, RunView, register_callback
from ddpkit.runtime.collectives import all_gather_rows, is_main
from ddpkit.runtime.session import current_world, reference_world_size

RECORD_FILE = "record.json"
SAMPLES_FOLDER = "samples"  # each process's samples, one file each
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
        self._rows_kept: list[list[int]] = []  # [index, inputs hash, targets hash] so far
        self._rows = out / SAMPLES_FOLDER / f"{os.getpid()}.jsonl"  # this process's, appended
        self._kill_at = int(os.environ.get(KILL_AT_ENV, "0")) or None
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
        if len(indices) != n or len(self._rows_kept) >= _MAX_SAMPLES:
            return
        per_sample = [t for t in tensor_leaves(batch) if t.dim() and t.shape[0] == n]
        first, rest = per_sample[0], per_sample[1:]
        rows = [[index, fingerprint(first[row]), sum(fingerprint(t[row]) for t in rest) % (1 << 63)]
                for row, index in enumerate(indices)]  # fmt: skip
        self._rows_kept.extend(rows)
        self._rows.parent.mkdir(parents=True, exist_ok=True)
        with self._rows.open("a") as out:  # on disk before the step: a kill cannot lose them
            out.write("".join(json.dumps(row) + "\n" for row in rows))

    def on_train_batch_end(self, trainer: RunView, batch: Any, metrics: Any) -> None:
        """``DDPKIT_VERIFY_KILL_AT``: the group's last rank dies with SIGKILL after that step,
        as a process killed from outside would (torch's agent restarts its group)."""
        world = current_world()
        last = world.rank == world.world_size - 1 and not world.restart  # first start only
        if self._kill_at is not None and trainer.step == self._kill_at and last:
            os.kill(os.getpid(), signal.SIGKILL)

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
        # This start's ranks, on every host, gathered; and what earlier starts here left on disk
        samples = _gather_samples(self._rows_kept)
        if is_main():
            samples = {**read_samples(self.out / SAMPLES_FOLDER), **samples}
            self._write(trainer.step, final, samples, trainer.loader)

    def _write(self, steps: int, final: dict[str, torch.Tensor], samples: dict[str, Any],
               loader: Any) -> None:  # fmt: skip
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
            "dealing": dealing_of(loader),
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


def dealing_of(loader: Any) -> list[int]:
    """How many slices each committed step trained, where the batches deal among replica
    groups (``ReplicaBatches.record``); empty for any other loader.

    Example:
        >>> dealing_of([1, 2, 3])
        []
    """
    record = getattr(loader, "record", None)
    return [len(slices) for _, slices in record] if isinstance(record, list) else []


def read_samples(folder: Path) -> dict[str, list[int]]:
    """Every sample the run's processes trained on (every start of each, a killed one's
    included): its two fingerprints by dataset index.

    Example:
        >>> read_samples(Path("/nonexistent"))
        {}
    """
    found: dict[str, list[int]] = {}
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        for line in path.read_text().splitlines():
            index, inputs_hash, targets_hash = json.loads(line)
            found.setdefault(str(index), [inputs_hash, targets_hash])
    return found


def _gather_samples(samples: list[list[int]]) -> dict[str, list[int]]:
    mine = torch.tensor(samples, dtype=torch.int64).reshape(-1, 3)
    rows = torch.cat(all_gather_rows(mine)).tolist()
    found: dict[str, list[int]] = {}
    for index, inputs_hash, targets_hash in rows:
        found.setdefault(str(index), [inputs_hash, targets_hash])
    return found
