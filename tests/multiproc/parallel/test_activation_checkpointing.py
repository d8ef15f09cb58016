"""Activation checkpointing on 2 gloo workers: the GPT example's blocks recomputed under FSDP
pass ``ddpkit verify``, and under DDP and FSDP, compiled or not, they train to the parameters
the run without recomputation reaches, each block's forward running again in backward, and the
compiled run leaving Dynamo graphs."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddpkit
from helpers import strategy_workers as workers
from helpers.launch_helpers import ddpkit_cli
from helpers.mp_workers import max_abs_diff

pytestmark = pytest.mark.multiproc


@pytest.mark.timeout(300)
def test_verify_passes_for_the_gpt_sharded_and_recomputed(tmp_path: Path) -> None:
    done = ddpkit_cli(
        "verify", "examples/gpt.py", "--workers", "2", "--steps", "4", "--out", str(tmp_path),
        "--strategy", "fsdp", "--activation-checkpointing", timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("PASS: 2 workers computed what one process computes")
    said = (tmp_path / "workers2" / "output.log").read_text()
    assert "activation checkpointing: 3 Block block(s) recomputed in backward" in said
    assert "training FSDP; global batch 32 = 16 per device x 2 ranks" in said


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_recomputed_blocks_train_as_kept_ones_compiled_or_not(strategy: str) -> None:
    kept = ddpkit.spawn(workers.gpt_with_recompute, 2, strategy, False)
    recomputed = ddpkit.spawn(workers.gpt_with_recompute, 2, strategy, True)
    compiled = ddpkit.spawn(workers.gpt_with_recompute, 2, strategy, True, {"backend": "aot_eager"})
    assert max_abs_diff(kept[0]["state"], kept[1]["state"]) == 0.0  # one model on both ranks
    assert max_abs_diff(kept[0]["state"], recomputed[0]["state"]) <= 1e-6
    assert max_abs_diff(kept[0]["state"], compiled[0]["state"]) <= 1e-5
    # Equal parameters would also come from a run that dropped the recomputation or the
    # compiling: what each leaves behind must be there too.
    blocks = kept[0]["blocks"]
    assert blocks == 3  # GPTConfig's n_layer: every Block is counted
    assert [r["forwards"] for r in kept] == [[blocks] * 4] * 2  # once per step, kept
    assert [r["forwards"] for r in recomputed] == [[2 * blocks] * 4] * 2  # again in backward
    assert [r["graphs"] for r in kept + recomputed] == [0] * 4  # eager: the counter is honest
    graphs = [r["graphs"] for r in compiled]
    assert min(graphs) >= 1, f"compile=... ran eagerly: Dynamo graphs per rank {graphs}"
