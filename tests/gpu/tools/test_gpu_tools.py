"""GPU tier, one GPU: ``doctor --smoke`` over NCCL, ``doctor --run`` and ``verify`` on CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.gpus import needs_gpus
from helpers.launch_helpers import ddpkit_cli

pytestmark = needs_gpus(1)


@pytest.mark.timeout(300)
def test_doctor_smoke_all_reduces_over_nccl_on_one_gpu() -> None:
    done = ddpkit_cli("doctor", "--smoke", "--nproc", "1", timeout=240)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "nccl" in output.lower(), output


@pytest.mark.timeout(300)
def test_doctor_run_trains_the_gpt_example_on_the_gpu() -> None:
    done = ddpkit_cli("doctor", "--nproc", "1", "--steps", "10", "--run", "examples/gpt.py",
                      timeout=240)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "cuda:0" in output, output


@pytest.mark.timeout(300)
def test_verify_passes_the_gpt_example_on_cuda(tmp_path: Path) -> None:
    done = ddpkit_cli("verify", "examples/gpt.py", "--workers", "1", "--steps", "6",
                      "--out", str(tmp_path), timeout=240)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "PASS" in output, output
    for side in ("reference", "workers1"):  # each side's own log says its device
        log = (tmp_path / side / "output.log").read_text()
        assert "device cuda:0" in log, (side, log)
    # The launched worker wraps as N do; the plain process is the model alone.
    assert "training DDP;" in (tmp_path / "workers1" / "output.log").read_text()
