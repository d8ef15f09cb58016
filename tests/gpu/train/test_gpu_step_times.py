"""GPU tier: the step clock's CUDA-event path (skipped without a CUDA GPU).

On a GPU the host only queues kernels, so a host clock around the forward and backward times
the launches; the clock records CUDA events instead and reads them when the ranks share
their times. These tests make GPU work whose duration is known from a synchronised timer and
check that the clock's compute time carries it, and that a Trainer's epoch on a GPU reports
the breakdown and CUDA's peak allocation.
"""

from __future__ import annotations

import time

import pytest
import torch

import ddpkit
from ddpkit.observe.steptime import Phase, StepClock
from helpers.gpus import needs_gpus

pytestmark = needs_gpus(1)


def gpu_seconds(work: torch.nn.Module, x: torch.Tensor) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    work(x).sum().backward()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def test_compute_is_timed_on_the_gpu_not_by_the_launches() -> None:
    device = torch.device("cuda")
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).to(device)
    x = torch.randn(4096, 4096, device=device)
    truth = min(gpu_seconds(model, x) for _ in range(3))  # warm, then the GPU's own time
    clock = StepClock([model], device)
    clock.enter(Phase.COMPUTE)
    launched = time.perf_counter()
    model(x).sum().backward()  # queued: returns before the GPU is done
    launch_s = time.perf_counter() - launched
    clock.backward_done()
    clock.enter(Phase.OPTIMIZER)
    clock.step_done()
    seconds = clock.totals().seconds  # reads the events (waits for the GPU)
    gpu = seconds[Phase.COMPUTE] + seconds[Phase.SYNC]
    assert gpu == pytest.approx(truth, rel=0.3), (gpu, truth, launch_s)


def test_a_trainer_epoch_on_the_gpu_reports_the_breakdown_and_cuda_peak() -> None:
    ddpkit.init()
    try:
        model = ddpkit.prepare_model(torch.nn.Linear(512, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.utils.data.TensorDataset(torch.randn(512, 512), torch.randint(0, 10, (512,)))
        history = ddpkit.Trainer(model, opt, torch.nn.functional.cross_entropy).fit(
            ddpkit.prepare_loader(data, batch_size=64), epochs=2
        )
    finally:
        ddpkit.shutdown()
    for epoch in history:
        assert epoch["time/compute_ms"] > 0 and epoch["time/step_ms"] > 0
        assert 0 < epoch["mem/peak_mb"] < torch.cuda.get_device_properties(0).total_memory / 2**20
