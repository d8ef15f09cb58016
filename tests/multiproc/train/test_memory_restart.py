"""A worker killed with SIGKILL costs no completed step: the restarted workers go on from the
step kept in the node's memory, read nothing from storage, and end bit-identical to an
uninterrupted run; the job's memory folder is gone after it.

tests/scripts/memory_restart.py trains 2 epochs of 40 steps with dropout, AdamW and a schedule
under ``ddpkit run --max-restarts 1`` (DDP, and FSDP); its checkpoint folder is written only at
the end, so a resume from storage would start over.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import ddpkit
from helpers import mp_workers
from helpers.launch_helpers import SCRIPTS, ddpkit_cli

pytestmark = pytest.mark.multiproc


def train(out: Path, *kill: str, memory: bool = True, strategy: str = "ddp") -> str:
    flags = [] if memory else ["--no-memory-snapshots"]
    done = ddpkit_cli("run", "--nproc", "2", "--max-restarts", "1", *flags,
                      str(SCRIPTS / "memory_restart.py"), str(out), *kill,
                      env={"MEMORY_RESTART_STRATEGY": strategy})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("uninterrupted")
    train(out)
    final: dict[str, object] = torch.load(out / "final.pt", weights_only=True)
    return final


def same_run(out: Path, reference: dict[str, object]) -> None:
    final = torch.load(out / "final.pt", weights_only=True)
    weights, expected = final["weights"], reference["weights"]
    assert isinstance(expected, dict) and weights.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(weights[name], tensor), name  # bit for bit
    losses = [epoch["loss"] for epoch in final["history"]]
    assert losses == [epoch["loss"] for epoch in reference["history"]]  # type: ignore[attr-defined]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("kill_after", "resumed_at"),
    [("57", "step 57 (epoch 2 batch 17)"), ("40", "step 40 (the start of epoch 2)")],
)
def test_a_killed_worker_resumes_from_memory_with_no_step_lost(
    uninterrupted: dict[str, object], tmp_path: Path, kill_after: str, resumed_at: str
) -> None:
    output = train(tmp_path, kill_after)
    assert f"resumed from memory at {resumed_at}: 0 completed step(s) lost" in output, output
    assert "0.0 s read from storage" in output and "resumed from /" not in output
    same_run(tmp_path, uninterrupted)
    folder = (tmp_path / "memory-folder").read_text()
    assert folder.startswith("/dev/shm/ddpkit-launch-") and not os.path.exists(folder)


@pytest.mark.timeout(300)
def test_a_sharded_model_resumes_from_its_ranks_shards_in_memory(tmp_path: Path) -> None:
    """FSDP: each rank keeps its own shards (plain tensors), made DTensors again on resume;
    the run ends bit-identical to an uninterrupted FSDP run."""
    reference = tmp_path / "uninterrupted"
    reference.mkdir()
    train(reference, strategy="fsdp")
    expected = torch.load(reference / "final.pt", weights_only=True)
    killed = tmp_path / "killed"
    killed.mkdir()
    output = train(killed, "57", strategy="fsdp")
    said = "resumed from memory at step 57 (epoch 2 batch 17): 0 completed step(s) lost"
    assert said in output and "training FSDP" in output, output
    assert "0.0 s read from storage" in output and "resumed from /" not in output
    same_run(killed, expected)


@pytest.mark.timeout(240)
def test_without_memory_snapshots_a_restart_starts_over(
    uninterrupted: dict[str, object], tmp_path: Path
) -> None:
    output = train(tmp_path, "57", memory=False)
    assert "resumed from memory" not in output
    assert output.count("training DDP") == 2  # the restart trained from its first step
    same_run(tmp_path, uninterrupted)  # from scratch, it is the same run again


@pytest.mark.timeout(120)
def test_ranks_whose_launchers_differ_agree_not_to_resume_from_memory(tmp_path: Path) -> None:
    """A host that joined an elastic job restarts for the first time while the others do
    for the second: rank 0 holds a snapshot, rank 1 keeps none. Neither hangs."""
    tmp_path.chmod(0o700)
    assert ddpkit.spawn(mp_workers.memory_resume_where_launchers_differ, 2, str(tmp_path)) == [
        None,
        None,
    ]
