"""The scale tier: what ddpkit promises at scale, at world sizes past four ranks on one machine
(gloo on loopback, tiny models, warm workers: N processes share one torch import).

``make test`` runs it at 8 ranks; ``make scale`` at 8, 16, 32 and 64 (``SCALE_SIZES``, a
comma-separated list, sets the sizes). Each size: a Trainer job launched, trained and ended
with the step-time breakdown and nothing ddpkit adds inside its steps; a rank stopped inside
a step reported with the step, the rank and the time to the verdict; the last rank killed and
the job resumed from memory, bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
import torch

from helpers.launch_helpers import REPO, SCRIPTS, ddpkit_cli

SIZES = [int(n) for n in os.environ.get("SCALE_SIZES", "8").split(",") if n.strip()]
HANG_TIMEOUT_S = 10

pytestmark = [pytest.mark.multiproc, pytest.mark.scale, pytest.mark.timeout(900)]


@pytest.mark.parametrize("size", SIZES)
def test_a_trainer_job_launches_trains_and_ends(size: int, tmp_path: Path) -> None:
    started = time.monotonic()
    done = ddpkit_cli("run", "--nproc", str(size), str(REPO / "benchmarks" / "scale_cost_job.py"),
                      str(tmp_path), "3", timeout=600)  # fmt: skip
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    ranks = [json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")]
    assert sorted(r["rank"] for r in ranks) == list(range(size)), out[-3000:]
    assert all(r["steps"] == 24 and r["epochs"] == 3 for r in ranks)
    # nothing ddpkit adds inside a step; the epoch's line has the breakdown, once an epoch
    assert not any(k.startswith("step:") for r in ranks for k in r["calls"]), ranks[0]
    assert len(re.findall(r"epoch \d/3 .* ms/step: data", out)) == 3, out[-3000:]
    # every rank is as starved of CPU as the next: a rank named slower says so
    for line in (line for line in out.splitlines() if "straggler:" in line):
        assert f"this host runs {size} CPU ranks on" in line, line
    print(f"{size} ranks: launched, trained 3 epochs and ended in {took:.1f} s")


@pytest.mark.parametrize("size", SIZES)
def test_a_slowed_rank_is_named(size: int, tmp_path: Path) -> None:
    """The last rank sleeps in each step, longer as more ranks share the 2 cores (each rank's
    step takes about N/2 times a lone one's)."""
    slow, seconds = size - 1, 0.05 * size
    done = ddpkit_cli("run", "--nproc", str(size), str(REPO / "benchmarks" / "scale_cost_job.py"),
                      str(tmp_path), "3", env={"SCALE_SLOW_RANK": f"{slow}:{seconds}"},
                      timeout=600)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    named = [line for line in out.splitlines() if "straggler:" in line]
    assert named and all(f"straggler: rank {slow} is" in line for line in named), out[-3000:]
    print(f"{size} ranks: {named[0].split('straggler: ')[1][:90]}")


@pytest.mark.parametrize("size", [n for n in SIZES if n <= 16])
def test_verify_passes(size: int, tmp_path: Path) -> None:
    done = ddpkit_cli("verify", "examples/wine.py", "--workers", str(size), "--steps", "4",
                      "--out", str(tmp_path), timeout=600)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert done.stdout.strip().endswith(
        f"PASS: {size} workers computed what one process computes"
    ), done.stdout[-3000:]


@pytest.mark.parametrize("size", SIZES)
def test_a_sharded_checkpoint_saved_at_this_size_resumes_exactly(size: int, tmp_path: Path
                                                               ) -> None:  # fmt: skip
    """FSDP: 2 epochs saved (each rank its own shard files), then a run to 3 that resumes
    from them, against 3 epochs uninterrupted: the same weights, bit for bit. The data grows
    with the world (40 steps an epoch at any size): an example's fixed test split (wine's 36
    samples) cannot feed 64 ranks."""

    def fsdp(epochs: int, out: Path) -> tuple[str, dict]:
        out.mkdir(exist_ok=True)
        env = {"MEMORY_RESTART_STRATEGY": "fsdp", "MEMORY_RESTART_EPOCHS": str(epochs)}
        done = ddpkit_cli("run", "--nproc", str(size), str(SCRIPTS / "memory_restart.py"),
                          str(out), env=env, timeout=600)  # fmt: skip
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        return done.stdout + done.stderr, torch.load(out / "final.pt", weights_only=True)

    fsdp(2, tmp_path / "resumed")
    shards = list((tmp_path / "resumed" / "checkpoints").rglob("*.distcp"))
    assert len(shards) >= size, sorted(p.name for p in shards)  # written by every rank
    said, resumed = fsdp(3, tmp_path / "resumed")
    assert "resumed from" in said and "epoch 3/3" in said and "epoch 1/3" not in said, said
    _, straight = fsdp(3, tmp_path / "straight")
    for name, tensor in straight["weights"].items():
        assert torch.equal(resumed["weights"][name], tensor), name
    assert resumed["history"][-1]["loss"] == straight["history"][-1]["loss"]
    print(f"{size} ranks: FSDP saved {len(shards)} shard files, resumed bit-identical")


@pytest.mark.parametrize("size", SIZES)
def test_a_rank_stopped_in_a_step_is_reported_with_the_step_and_the_rank(size: int) -> None:
    started = time.monotonic()
    done = ddpkit_cli("run", "--nproc", str(size), "--hang-timeout", str(HANG_TIMEOUT_S),
                      str(SCRIPTS / "hang_in_step.py"), timeout=600)  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 124, done.stderr[-3000:]
    verdict = done.stderr.split("ddpkit run: worker rank")[-1]
    assert "rank 1 has not reached it" in verdict, verdict[-3000:]
    assert re.search(r"rank \d+ waited \d+ s in step 3", verdict), verdict[-3000:]
    assert "loss_that_stalls_on_rank_1" in verdict, verdict[-3000:]
    assert f"gathered {size} of {size} ranks' states from the store" in verdict, verdict[-3000:]
    lines = verdict.strip().splitlines()
    assert len(lines) < 40, verdict[-3000:]  # a verdict, not a line per rank
    print(f"{size} ranks: the hang reported {took:.1f} s after launch "
          f"(hang timeout {HANG_TIMEOUT_S} s); the verdict {len(lines)} lines, "
          f"{len(verdict.encode())} bytes")  # fmt: skip


@pytest.mark.parametrize("size", SIZES)
def test_a_killed_rank_is_resumed_from_memory_exactly(size: int, tmp_path: Path) -> None:
    finals = []
    for run, kill in (("uninterrupted", ()), ("killed", ("57",))):
        out = tmp_path / run
        out.mkdir()
        done = ddpkit_cli("run", "--nproc", str(size), "--max-restarts", "1",
                          str(SCRIPTS / "memory_restart.py"), str(out), *kill,
                          timeout=600)  # fmt: skip
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-3000:]
        finals.append(torch.load(out / "final.pt", weights_only=True))
    said = "resumed from memory at step 57 (epoch 2 batch 17): 0 completed step(s) lost"
    assert said in output, output[-3000:]
    expected, final = finals
    for name, tensor in expected["weights"].items():
        assert torch.equal(final["weights"][name], tensor), name
    assert [e["loss"] for e in final["history"]] == [e["loss"] for e in expected["history"]]
