"""A stream (IterableDataset) on 2 ranks x 2 loader workers whose shares differ by 11 batches:
every epoch ends on both ranks at the same step, every item is trained on exactly once (the
short rank's repeats aside), and a kill -9 mid-epoch resumes to the same final parameters."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from ddpkit.checkpoint import load_checkpoint
from helpers.launch_helpers import SCRIPTS, ddpkit_cli

pytestmark = pytest.mark.multiproc

ITEMS, STEPS_PER_EPOCH, EPOCHS = 60, 13, 3


def train(folder: Path, *launcher: str, kill_at: int | None = None) -> str:
    folder.mkdir()
    extra = [] if kill_at is None else [str(kill_at)]
    done = ddpkit_cli("run", "--nproc", "2", *launcher, str(SCRIPTS / "stream_train.py"),
                      str(folder), *extra, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def batches_seen(folder: Path, rank: int, attempt: int = 0) -> dict[int, list[tuple[int, ...]]]:
    """{epoch: [the item ids of each step's batch]} as the rank trained on them."""
    seen: dict[int, list[tuple[int, ...]]] = {}
    for line in (folder / f"seen-rank{rank}-attempt{attempt}.txt").read_text().splitlines():
        epoch, _step, *ids = map(int, line.split())
        seen.setdefault(epoch, []).append(tuple(ids))
    return seen


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("stream") / "run"
    return folder, train(folder)


def test_uneven_shares_end_each_epoch_together_and_every_item_is_trained_on_once(
    uninterrupted: tuple[Path, str],
) -> None:
    folder, output = uninterrupted
    ranks = [batches_seen(folder, rank) for rank in (0, 1)]
    for epoch in range(EPOCHS):
        assert [len(seen[epoch]) for seen in ranks] == [STEPS_PER_EPOCH] * 2  # in step
        # Each rank's distinct batches are its real share; the rest repeat its first ones.
        own = [list(dict.fromkeys(seen[epoch])) for seen in ranks]
        assert [len(batches) for batches in own] == [13, 2]
        ids = sorted(i for batches in own for batch in batches for i in batch)
        assert ids == list(range(ITEMS)), f"epoch {epoch}: items missing or read twice"
    assert ranks[0][0] != ranks[0][1]  # the stream reshuffled by the epoch (set_epoch)
    assert output.count("share of the stream ended 11 step(s) before the longest") == EPOCHS


def test_a_kill_9_mid_epoch_resumes_to_the_same_final_parameters(
    uninterrupted: tuple[Path, str], tmp_path: Path
) -> None:
    folder = tmp_path / "killed"
    output = train(folder, "--max-restarts", "1", kill_at=20)  # epoch 2, step 7 of 13
    assert "restart 1 of 1" in output
    # from memory at the step the worker was killed after (its checkpoint was step 18's)
    assert "resumed from memory at step 20 (epoch 2 batch 7): 0 completed step(s) lost" in output
    step = 20
    final = load_checkpoint(folder / "ckpt" / "epoch_000003.pt")["model"]
    expected = load_checkpoint(uninterrupted[0] / "ckpt" / "epoch_000003.pt")["model"]
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[name], expected[name]) for name in final)
    # After the restart each rank went on from the step kept in memory with the batches
    # the uninterrupted run trained on there.
    again = [batches_seen(folder, rank, attempt=1) for rank in (0, 1)]
    before = [batches_seen(uninterrupted[0], rank) for rank in (0, 1)]
    for rank in (0, 1):
        assert again[rank][1] == before[rank][1][step - STEPS_PER_EPOCH :]


def test_the_logs_have_one_point_per_step_across_the_restart(
    uninterrupted: tuple[Path, str], tmp_path: Path
) -> None:
    """TensorBoard's own reader and the CSV: steps 1..39 once each, the killed run's curve
    equal to the uninterrupted one's (the points after the step it resumed from were purged;
    each step's points reach the files before its memory snapshot)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = tmp_path / "killed"
    train(folder, "--max-restarts", "1", kill_at=20)
    curves = []
    for run in (uninterrupted[0], folder):
        events = EventAccumulator(str(run / "logs"))
        events.Reload()
        points = events.Scalars("train/loss")
        assert [p.step for p in points] == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))
        losses = [p.value for p in points]
        assert [p.step for p in events.Scalars("epoch/loss")] == [13, 26, 39]
        rows = list(csv.DictReader((run / "logs" / "metrics.csv").open()))
        in_csv = [r for r in rows if r["tag"] == "train/loss"]
        assert [int(r["step"]) for r in in_csv] == [p.step for p in points]  # the same points
        assert [float(r["value"]) for r in in_csv] == pytest.approx(losses, rel=1e-6)
        curves.append(losses)
    assert curves[0] == pytest.approx(curves[1], abs=1e-6)
    assert len(list((folder / "logs").glob("events.out.tfevents.*"))) == 2  # one per attempt


def test_a_hugging_face_stream_is_read_once_across_ranks_and_loader_workers(
    tmp_path: Path,
) -> None:
    """HF's IterableDataset splits itself over loader workers: ddpkit splits it by node with
    the library's own split_dataset_by_node, not again item by item (which lost half of it)."""
    pytest.importorskip("datasets")
    folder = tmp_path / "hf"
    folder.mkdir()
    done = ddpkit_cli("run", "--nproc", "2", str(SCRIPTS / "stream_train.py"), str(folder),
                      "--hf", timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [batches_seen(folder, rank) for rank in (0, 1)]
    for epoch in range(EPOCHS):
        assert len(ranks[0][epoch]) == len(ranks[1][epoch])  # in step
        own = [list(dict.fromkeys(seen[epoch])) for seen in ranks]
        ids = sorted(i for batches in own for batch in batches for i in batch)
        assert ids == list(range(ITEMS)), f"epoch {epoch}: items missing or read twice"
    assert ranks[0][0] != ranks[0][1]  # HF's buffer shuffle moved on with the epoch
