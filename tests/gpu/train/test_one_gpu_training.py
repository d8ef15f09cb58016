"""GPU tier, one GPU: the training paths only CUDA exercises, from one launch of
tests/scripts/gpu_train.py under ``ddpkit run --nproc 1`` (NCCL, the device, DDP and FSDP
through both faces in bf16 and in fp16 with the gradient scaler, a NaN step skipped, and
``compile=True``). A launched world of one wraps as N do, so this is DDP's and FSDP's path.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.gpus import needs_gpus
from helpers.launch_helpers import SCRIPTS, ddpkit_cli

pytestmark = needs_gpus(1)

STRATEGIES = {"ddp": "DDP", "fsdp": "FSDP"}
PRECISIONS = ("bf16", "fp16")


class Trained:
    """The launch's output and what rank 0 saved."""

    def __init__(self, folder: Path, output: str) -> None:
        self.folder, self.output = folder, output

    def load(self, name: str) -> dict[str, Any]:
        loaded: dict[str, Any] = torch.load(self.folder / f"{name}.pt", weights_only=True)
        return loaded


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    folder = tmp_path_factory.mktemp("gpu_train")
    done = ddpkit_cli("run", "--nproc", "1", str(SCRIPTS / "gpu_train.py"), str(folder),
                      timeout=420)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return Trained(folder, output)


@pytest.mark.timeout(480)
def test_one_gpu_joins_over_nccl_on_its_own_device(trained: Trained) -> None:
    facts = trained.load("facts")
    assert (facts["backend"], facts["device"]) == ("nccl", "cuda:0"), facts
    assert "world size 1 (1 process per node x 1 node), backend nccl, device cuda:0" in (
        trained.output
    )


@pytest.mark.timeout(480)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_both_faces_train_alike_on_the_gpu_and_skip_the_nan_step(
    trained: Trained, strategy: str, precision: str
) -> None:
    trainer = trained.load(f"trainer-{strategy}-{precision}")
    loop = trained.load(f"loop-{strategy}-{precision}")
    assert f"training {STRATEGIES[strategy]}; " in trained.output
    for run in (trainer, loop):
        assert run["device"] == "cuda:0" and run["steps"] == 15, run["device"]
        assert run["skipped"] == 3, run["skipped"]  # the NaN sample's step, each epoch
        assert all(math.isfinite(loss) for loss in run["losses"]), run["losses"]
        assert all(0 < h["mem/peak_mb"] < total_mb() for h in run["history"]), run["history"]
    different = [k for k in trainer["state"] if not torch.equal(trainer["state"][k],
                                                                   loop["state"][k])]  # fmt: skip
    assert different == [], f"the two faces' parameters differ on the GPU: {different}"


@pytest.mark.timeout(480)
def test_a_compiled_model_trains_on_the_gpu_as_the_eager_one_does(trained: Trained) -> None:
    compiled, eager = trained.load("compiled"), trained.load("trainer-ddp-bf16")
    assert compiled["device"] == "cuda:0" and compiled["skipped"] == 3
    # Inductor fuses kernels, so bf16 rounding differs a little from eager's.
    for name, value in eager["state"].items():
        assert torch.allclose(compiled["state"][name], value, atol=2e-2), name
    assert compiled["losses"] == pytest.approx(eager["losses"], rel=5e-2)


def total_mb() -> float:
    return torch.cuda.get_device_properties(0).total_memory / 2**20
