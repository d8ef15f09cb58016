"""A compiled model trained with a checkpoint_dir, in one process: ``python compiled_resume.py
CHECKPOINT_DIR EPOCHS [CPU_CAPABILITY]`` prints ``cache {"hit": H, "miss": M}``, inductor's FX
graph cache counts. CPU_CAPABILITY stands in for another machine's (its fingerprint)."""

import json
import sys

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch.utils.data import TensorDataset

import ddpkit

if len(sys.argv) > 3:  # as on a machine with other vector instructions
    torch.backends.cpu.get_cpu_capability = lambda: sys.argv[3]

ddpkit.init(seed=0, hang_timeout=0)
torch.manual_seed(0)


class Net(torch.nn.Module):
    """A module of its own: under DDP (ddpkit run) Dynamo skips an nn.Sequential's forward
    after DDP's graph break (a torch.nn frame), so nothing would be compiled."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.outer = torch.nn.Linear(8, 32), torch.nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(F.gelu(self.inner(x)))


model = Net()
model = ddpkit.prepare_model(model, compile=True)
data = TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy,
                         checkpoint_dir=sys.argv[1])  # fmt: skip
trainer.fit(ddpkit.prepare_loader(data, batch_size=8), epochs=int(sys.argv[2]))
found = counters["inductor"]
print(
    "cache " + json.dumps({"hit": found["fxgraph_cache_hit"], "miss": found["fxgraph_cache_miss"]})
)
