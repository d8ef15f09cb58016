"""A job resumed at another world size goes on where it stopped: each sample once, the same
global batch, the parameters of an uninterrupted run.

tests/scripts/elastic_resume.py records every sample it trains. A 2-worker run crashes in
epoch 2 (its newest checkpoint 8 steps in); copies of its checkpoints resume on 1 and on 3
workers. Epoch 2's samples, counted over the crashed run (up to its checkpoint) and the
resumed one, must be each of the 960 exactly once, and the final parameters those of an
uninterrupted 2-worker run within ``ddpkit verify``'s fp32 tolerances.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch

from helpers.launch_helpers import SCRIPTS, ddpkit_cli

pytestmark = pytest.mark.multiproc

SAMPLES, CHECKPOINTED = 960, 88  # the crash before step 90 leaves step 88's checkpoint


def run(workers: int, folder: Path, records: Path, *crash: str) -> str:
    done = ddpkit_cli("run", "--nproc", str(workers), str(SCRIPTS / "elastic_resume.py"),
                      str(folder), str(records), *crash)  # fmt: skip
    assert (done.returncode != 0) == bool(crash), done.stdout + done.stderr
    return done.stdout + done.stderr


def trained(records: Path, up_to_step: int | None = None) -> list[tuple[int, int]]:
    """(epoch, sample id) of every sample trained, by every rank, up to a step."""
    found = []
    for path in records.glob("rank*.txt"):
        for line in path.read_text().splitlines():
            if line.startswith("#"):
                continue
            epoch, step, sample = map(int, line.split())
            if up_to_step is None or step <= up_to_step:
                found.append((epoch, sample))
    return found


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-worker run that crashed before step 90, and an uninterrupted one beside it."""
    root = tmp_path_factory.mktemp("elastic")
    run(2, root / "ck", root / "records", "90")
    run(2, root / "uninterrupted-ck", root / "uninterrupted")
    return root


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [1, 3])
def test_resumed_on_another_world_size_every_sample_once_and_the_same_parameters(
    crashed: Path, tmp_path: Path, workers: int
) -> None:
    shutil.copytree(crashed / "ck", tmp_path / "ck")
    output = run(workers, tmp_path / "ck", tmp_path / "records")
    assert f"written by 2 rank(s) and this run has {workers}" in output, output
    assert "epoch 2 goes on after the 96 samples the ranks had done" in output, output
    per_device = {1: "12 per device x 1 rank", 3: "4 per device x 3 ranks"}[workers]
    assert f"world size 2 -> {workers}: global batch 12 kept ({per_device})" in output, output
    before = trained(crashed / "records", up_to_step=CHECKPOINTED)
    seen = Counter(before + trained(tmp_path / "records"))
    for epoch in (0, 1):
        counts = Counter(count for (e, _), count in seen.items() if e == epoch)
        assert counts == {1: SAMPLES}, (epoch, counts)  # each of the 960 exactly once
    expected = torch.load(crashed / "uninterrupted" / "final.pt", weights_only=True)
    final = torch.load(tmp_path / "records" / "final.pt", weights_only=True)
    for name, tensor in expected.items():
        torch.testing.assert_close(final[name], tensor, rtol=1e-4, atol=1e-6)
