"""A small job whose rank 0 writes down, in plain torch, what it held and sent: the witness
``ddpkit plan``'s dry run is compared with.

    plan_witness.py OUT.json [STRATEGY]    # ddp (default) or fsdp; DDPKIT_MAX_STEPS ends it

A 4-layer MLP (layers of different sizes: FSDP shards each, unevenly where a size is not a
multiple of the world), Adam, 4 samples a rank a step. Rank 0 measures, with torch's own
calls and none of ddpkit's plan: its parameters' local bytes, their gradients' just before each
optimizer step (an optimizer pre-hook), the optimizer's state, and from torch's Flight Recorder
the collectives of each step (its entries between the step's start and its end), rewritten to
OUT.json after each step. Under ``ddpkit plan`` it runs the same and writes the same file, unused.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import TensorDataset

import ddpkit
from ddpkit.flightrecorder.records import dump


def local_bytes(tensors: list[torch.Tensor]) -> int:
    locals_ = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in locals_)


class Witness(ddpkit.Callback):
    """Rank 0's record: the Flight Recorder's entries of each step, and the gradients."""

    rank_zero_only = True

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, out: str) -> None:
        self.model, self.opt, self.out = model, opt, out
        self.steps: dict[int, list[dict[str, Any]]] = {}
        self.gradients = 0
        self._first = 0
        opt.register_step_pre_hook(lambda *_: self._gradients(model))

    def _gradients(self, model: nn.Module) -> None:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        self.gradients = max(self.gradients, local_bytes(grads))

    def on_train_batch_start(self, trainer: Any, batch: Any) -> None:
        self._first = len(entries())

    def on_train_batch_end(self, trainer: Any, batch: Any, metrics: Any) -> None:
        """The step's record, and the file rewritten (DDPKIT_MAX_STEPS ends the process)."""
        self.steps[trainer.step] = entries()[self._first :]
        state = self.opt.state.values()
        record = {
            "parameters": local_bytes(list(self.model.parameters())),
            "gradients": self.gradients,
            "optimizer": local_bytes(
                [t for s in state for t in s.values() if isinstance(t, torch.Tensor)]
            ),
            "steps": self.steps,
        }
        with open(self.out, "w") as handle:
            json.dump(record, handle)


def entries() -> list[dict[str, Any]]:
    found = dump() or {"entries": []}
    keep = ("profiling_name", "input_sizes", "output_sizes", "input_dtypes", "output_dtypes")
    return [{k: e.get(k) for k in keep} for e in found["entries"]]


def main() -> None:
    out = sys.argv[1]
    strategy = sys.argv[2] if len(sys.argv) > 2 else "ddp"
    ddpkit.init(seed=0)
    net = nn.Sequential(nn.Linear(16, 50), nn.ReLU(), nn.Linear(50, 30), nn.ReLU(),
                        nn.Linear(30, 30), nn.ReLU(), nn.Linear(30, 3))  # fmt: skip
    model = ddpkit.prepare_model(net, strategy=strategy)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(128, 16, generator=generator),
                         torch.randint(0, 3, (128,), generator=generator))  # fmt: skip
    witness = Witness(model, opt, out)
    trainer = ddpkit.Trainer(model, opt, loss_fn=F.cross_entropy, callbacks=[witness])
    trainer.fit(ddpkit.prepare_loader(data, batch_size=4, shuffle=True), epochs=1)


if __name__ == "__main__":
    main()
