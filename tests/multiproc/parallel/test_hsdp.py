"""HSDP (FSDP2 on a (replicate, shard) mesh) on 4 gloo workers as a 2x2 mesh: it computes what
one process computes, and its sharded checkpoints resume on the same mesh bit for bit and as
FSDP on 2 workers within verify's tolerance, and export to one file bit for bit."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ddpkit
from helpers import strategy_workers as workers
from helpers.launch_helpers import ddpkit_cli, folder_names
from helpers.mp_workers import max_abs_diff

pytestmark = pytest.mark.multiproc


@pytest.mark.timeout(300)
def test_verify_passes_for_wine_on_a_2x2_mesh(tmp_path: Path) -> None:
    done = ddpkit_cli(
        "verify", "examples/wine.py", "--workers", "4", "--steps", "6", "--out", str(tmp_path),
        "--strategy", "hsdp", "--hsdp-shard-size", "2", timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("PASS: 4 workers computed what one process computes")
    said = (tmp_path / "workers4" / "output.log").read_text()
    assert "training HSDP (2 replicas x 2 shards); global batch 128 = 32 per device x 4" in said


def test_a_2x2_run_stopped_mid_epoch_resumes_bit_identical_and_as_fsdp_on_2(
    tmp_path: Path,
) -> None:
    full = ddpkit.spawn(workers.train_hybrid, 4, "hsdp", 2, str(tmp_path / "full"))
    assert full[0]["startup"].startswith("training HSDP (2 replicas x 2 shards); global batch 16")
    assert all(max_abs_diff(full[0]["state"], other["state"]) == 0.0 for other in full[1:])
    for suffix in (".pt", ".safetensors"):  # the newest shards as one file, without a group
        exported = ddpkit.checkpoint.export_checkpoint(
            tmp_path / "full", tmp_path / f"model{suffix}"
        )
        assert exported.source.endswith("full/epoch_000003.dcp")  # the newest: after step 12
        weights = torch.load(exported.path, weights_only=True) if suffix == ".pt" else (
            load_file(str(exported.path)))  # fmt: skip
        assert max_abs_diff(full[0]["state"], weights) == 0.0
    cut = tmp_path / "cut"
    with pytest.raises(ddpkit.WorkerFailedError, match="crash before step 7"):
        ddpkit.spawn(workers.train_hybrid, 4, "hsdp", 2, str(cut), 3, 7)
    assert folder_names(cut)[-1] == "epoch_000002_step_000006.dcp"
    kept = tmp_path / "kept"
    shutil.copytree(cut / "epoch_000002_step_000006.dcp", kept / "epoch_000002_step_000006.dcp")

    resumed = ddpkit.spawn(workers.train_hybrid, 4, "hsdp", 2, str(cut))
    assert [r["steps"] for r in resumed] == [6] * 4  # steps 7 to 12: a resume, not a rerun
    assert max_abs_diff(full[0]["state"], resumed[0]["state"]) == 0.0  # bit for bit
    as_fsdp = ddpkit.spawn(workers.train_hybrid, 2, "fsdp", None, str(kept))
    assert as_fsdp[0]["startup"].startswith("training FSDP; global batch 16 = 8 per device x 2")
    assert as_fsdp[0]["steps"] == 6
    assert max_abs_diff(full[0]["state"], as_fsdp[0]["state"]) <= 1e-5  # verify's fp32 bound
