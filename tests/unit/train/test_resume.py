"""Resuming in a world of one: exact mid-epoch resume, damaged checkpoints, refusals, guards."""

from __future__ import annotations

import math
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ddpkit
from ddpkit.checkpoint import list_checkpoints, load_checkpoint, parse_name, save_checkpoint
from ddpkit.errors import CheckpointError, NonFiniteLossError
from ddpkit.train.stop import StopSignals
from helpers.mp_workers import cpu_state, toy_dataset
from helpers.resume_helpers import Interrupted, dropout_model, train


def reseal(state: dict[str, object], path: Path) -> None:
    """Write an edited checkpoint back with a matching checksum."""
    position = parse_name(path.name)
    assert position is not None
    save_checkpoint(state, path.parent, position.epoch, position.step)


@pytest.mark.parametrize("crash_at", [4, 7, 10])
def test_a_crash_mid_epoch_resumes_to_the_same_parameters(tmp_path: Path, crash_at: int) -> None:
    full, full_history = train(tmp_path / "full")
    with pytest.raises(Interrupted):
        train(tmp_path / "cut", crash_at=crash_at)
    newest = list_checkpoints(tmp_path / "cut")[-1].name
    assert "_step_" in newest  # the resume starts inside an epoch
    resumed, resumed_history = train(tmp_path / "cut")
    for name, tensor in full.items():
        assert torch.equal(tensor, resumed[name]), name
    assert [h["loss"] for h in resumed_history] == pytest.approx(
        [h["loss"] for h in full_history], rel=1e-12
    )
    assert [h["samples"] for h in resumed_history] == [40.0, 40.0, 40.0]  # none repeated


def test_a_plain_dataloader_resumes_mid_epoch_by_reading_past_the_done_batches(
    tmp_path: Path,
) -> None:
    full, _ = train(tmp_path / "full", plain_loader=True)
    with pytest.raises(Interrupted):
        train(tmp_path / "cut", crash_at=8, plain_loader=True)
    resumed, history = train(tmp_path / "cut", plain_loader=True)
    assert all(torch.equal(full[k], resumed[k]) for k in full)
    assert history[1]["samples"] == 40.0


def test_without_the_random_state_the_resume_would_differ(tmp_path: Path) -> None:
    """The comparison above is not vacuous: dropout draws depend on the restored state."""
    full, _ = train(tmp_path / "full")
    with pytest.raises(Interrupted):
        train(tmp_path / "cut", crash_at=7)
    newest = list_checkpoints(tmp_path / "cut")[-1]
    state = load_checkpoint(newest)
    state["ranks"][0]["rng"]["torch"] = torch.manual_seed(999).get_state()
    reseal(state, newest)
    resumed, _ = train(tmp_path / "cut")
    assert any(not torch.equal(full[k], resumed[k]) for k in full)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    train(tmp_path, epochs=2, keep_last=None)
    previous, newest = list_checkpoints(tmp_path)[-2:]
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    else:
        flipped = bytearray(data)
        flipped[len(data) // 3] ^= 0x01
        newest.write_bytes(bytes(flipped))
    capsys.readouterr()
    _, history = train(tmp_path, epochs=3)
    out = capsys.readouterr()
    assert f"warning: skipping {newest}" in out.err
    assert f"kept it as {newest.name}.invalid" in out.out
    resumed_from = re.search(r"resumed from (\S+)", out.out)
    assert resumed_from and resumed_from.group(1) == str(previous)
    assert (tmp_path / f"{newest.name}.invalid").exists()
    assert len(history) == 3


def test_when_no_checkpoint_is_usable_the_run_stops_instead_of_starting_over(
    tmp_path: Path,
) -> None:
    train(tmp_path, epochs=1)
    for path in list_checkpoints(tmp_path):
        path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"none of the 3 checkpoint\(s\) .* could be loaded"):
        train(tmp_path, epochs=2)


def test_a_pickle_payload_as_newest_checkpoint_is_refused_and_never_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train(tmp_path, epochs=1)
    marker = tmp_path / "code-ran"

    class Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {marker}",))

    torch.save({"model": Payload()}, tmp_path / "epoch_000009.pt")
    train(tmp_path, epochs=2)
    assert "weights_only loading refuses to run" in capsys.readouterr().err
    assert not marker.exists()


def test_a_checkpoint_of_another_model_is_refused_with_the_differences(tmp_path: Path) -> None:
    train(tmp_path, epochs=1)

    def wider() -> nn.Module:
        return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))

    with pytest.raises(CheckpointError, match=r"a different model \(0\.weight is float32\[16, 6\] "
                       r"there, float32\[32, 6\] here"):  # fmt: skip
        train(tmp_path, epochs=2, model_fn=wider)
    assert len(list_checkpoints(tmp_path)) == 3  # nothing was renamed or deleted


def test_keep_last_prunes_only_older_checkpoints(tmp_path: Path) -> None:
    train(tmp_path, epochs=3, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "epoch_000003_step_000014.pt",
        "epoch_000003.pt",
    ]


def nan_at_step(step: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    calls = {"n": 0}

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        value = F.cross_entropy(outputs, targets)
        return value * float("nan") if calls["n"] == step else value

    return loss


def test_a_nan_loss_stops_before_the_update_naming_step_and_rank() -> None:
    ddpkit.init(hang_timeout=0)
    model = nn.Linear(6, 3)
    before_step_3: dict[str, torch.Tensor] = {}

    class Remember(ddpkit.Callback):
        def on_train_batch_end(
            self, trainer: ddpkit.Trainer, batch: object, metrics: object
        ) -> None:
            if trainer.step == 2:  # the update of step 2 is the last before the NaN
                before_step_3.update(cpu_state(model))

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = ddpkit.Trainer(model, opt, nan_at_step(3), callbacks=[Remember()])
    with pytest.raises(NonFiniteLossError, match=r"loss is nan on rank 0 at step 3 \(epoch 1\)"):
        trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=8), epochs=1)
    assert all(torch.equal(v, cpu_state(model)[k]) for k, v in before_step_3.items())


def test_skip_policy_skips_the_step_and_training_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ddpkit.init(hang_timeout=0)
    model = nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = ddpkit.Trainer(model, opt, nan_at_step(3), nonfinite_loss="skip")
    history = trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=8), epochs=2)
    assert trainer.skipped_steps == 1 and trainer.step == 10
    assert all(torch.isfinite(p).all() for p in model.parameters())
    out = capsys.readouterr().out
    assert "skipped step 3: loss is nan on rank 0" in out
    # The skipped batch is left out of its epoch's mean loss and sample count (was: loss nan)
    assert [h["samples"] for h in history] == [32.0, 40.0], history
    assert all(math.isfinite(h["loss"]) for h in history) and "loss nan" not in out, out


def test_stop_signals_are_caught_only_inside_and_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as signals:
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.received == "SIGTERM" and signals.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGUSR1)  # a second signal does not replace the first
        assert signals.received == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("position_known", [True, False], ids=["goes-on", "restarts"])
def test_a_checkpoint_written_by_more_ranks_goes_on_at_its_position_or_restarts_the_epoch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], position_known: bool
) -> None:
    with pytest.raises(Interrupted):
        train(tmp_path, crash_at=7)
    newest = list_checkpoints(tmp_path)[-1]
    state = load_checkpoint(newest)
    state["ranks"] = state["ranks"] * 2  # as if two ranks wrote it
    if not position_known:  # a loader that cannot go on at a position (a stream, say)
        state["progress"]["samples"] = None
    reseal(state, newest)
    capsys.readouterr()
    _, history = train(tmp_path)
    out = capsys.readouterr().out
    assert "written by 2 rank(s) and this run has 1: random streams start afresh" in out
    assert history[1]["samples"] == 40.0  # no sample counted twice either way
    steps = load_checkpoint(list_checkpoints(tmp_path)[-1])["step"]
    if position_known:  # step 6 (epoch 2's first) was saved: 8 samples of 40 done
        assert "epoch 2 goes on after the 8 samples the ranks had done" in out
        assert steps == 15
    else:  # epoch 2 ran again in full: 6 + 5 + 5 steps
        assert "the interrupted epoch restarts" in out
        assert steps == 16


def test_a_step_checkpoint_on_an_epochs_last_batch_is_that_epochs_checkpoint(
    tmp_path: Path,
) -> None:
    train(tmp_path, epochs=3, keep_last=None, save_every_steps=5)  # 5 steps per epoch
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "epoch_000001.pt",
        "epoch_000002.pt",
        "epoch_000003.pt",
    ]


def test_an_epoch_saved_in_the_first_format_resumes_its_sums() -> None:
    from ddpkit.train.state import upgrade
    from ddpkit.train.steps import MetricSums

    old = {"epoch": 1, "progress": {  # format 1: no "format"; sums [loss*n, n, correct, top-5]
        "metric_sums": torch.tensor([2.0, 4.0, 3.0, 4.0], dtype=torch.float64),
        "classifier": True, "top5": False}}  # fmt: skip
    progress = upgrade(old, "e.pt")["progress"]
    sums = MetricSums(torch.device("cpu"))
    sums.load(progress["metric_names"], progress["metric_sums"])
    assert sums.reduce() == {"loss": 0.5, "samples": 4.0, "accuracy": 0.75}


def test_a_checkpoint_in_an_unknown_format_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    train(tmp_path, epochs=1)
    newest = list_checkpoints(tmp_path)[-1]
    state = load_checkpoint(newest)
    state["format"] = "ddpkit.checkpoint/3"  # as a newer ddpkit might write it
    reseal(state, newest)
    with pytest.raises(CheckpointError, match=r"format 'ddpkit.checkpoint/3', which this ddpkit"):
        train(tmp_path, epochs=2)
    assert list_checkpoints(tmp_path)[-1] == newest  # not renamed .invalid: it is not damaged


@pytest.mark.parametrize("crash_at", [4, 7])
def test_checkpoints_written_in_the_background_resume_to_the_same_parameters(
    tmp_path: Path, crash_at: int
) -> None:
    full, full_history = train(tmp_path / "full")
    with pytest.raises(Interrupted):
        train(tmp_path / "cut", crash_at=crash_at, async_save=True)
    resumed, resumed_history = train(tmp_path / "cut", async_save=True)  # waits for the write
    assert all(torch.equal(tensor, resumed[name]) for name, tensor in full.items())
    assert [h["loss"] for h in resumed_history] == pytest.approx(
        [h["loss"] for h in full_history], rel=1e-12
    )
    written = [p.name for p in list_checkpoints(tmp_path / "cut")]
    assert written == [p.name for p in list_checkpoints(tmp_path / "full")]  # keep_last alike


def test_a_background_write_that_fails_is_raised_at_the_next_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddpkit.checkpoint import storage as store

    def disk_full(state: object, path: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "save_sealed", disk_full)
    with pytest.raises(CheckpointError, match=r"writing epoch_000001_step_000002\.pt in the "
                       r"background failed: \[Errno 28\] No space left"):  # fmt: skip
        train(tmp_path, async_save=True)


# A slow disk holds a write at most this long. A correct background write is let go within
# one toy step (40-60 ms measured here, a few hundred on a loaded 2-core machine); only a
# write that holds training up waits it out (and then fails the test below).
_HELD_AT_MOST_S = 20.0


def test_a_background_write_is_still_in_flight_while_the_next_step_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What async_save is for: training goes on while a checkpoint is written. A synchronous
    save passes every resume test above; this one fails it. The disk (save_sealed, the
    storage seam) completes the first write only once training has taken a step past that
    checkpoint's, which a write on the training thread never sees: it ends at its own step."""
    from ddpkit.checkpoint import storage as store

    real_save = store.save_sealed
    trained = [0]  # the optimizer steps taken, as the training thread says after each batch
    first: list[tuple[int, int]] = []  # (its checkpoint's step, the steps taken when let go)

    class Steps(ddpkit.Callback):
        def on_train_batch_end(self, trainer: Any, batch: Any, metrics: Any) -> None:
            trained[0] = trainer.step

    def slow_disk(state: dict[str, Any], path: Path) -> None:
        if not first:
            deadline = time.monotonic() + _HELD_AT_MOST_S
            while trained[0] <= state["step"] and time.monotonic() < deadline:
                time.sleep(0.001)
            first.append((state["step"], trained[0]))
        real_save(state, path)

    monkeypatch.setattr(store, "save_sealed", slow_disk)
    train(tmp_path, async_save=True, callbacks=[Steps()])
    [(saved, taken)] = first
    assert taken > saved, (
        f"step {saved}'s checkpoint was written with {taken} steps taken: training waited "
        "for the write, as for a synchronous save"
    )
    # The held write completed all the same, and so did every later one.
    assert [p.name for p in list_checkpoints(tmp_path)][-1] == "epoch_000003.pt"


def test_async_save_needs_a_checkpoint_dir() -> None:
    ddpkit.init()
    try:
        model = nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(ddpkit.errors.ConfigError, match="async_save=True needs a checkpoint"):
            ddpkit.Trainer(model, opt, F.mse_loss, async_save=True)
    finally:
        ddpkit.shutdown()


def loop_train(folder: Path, crash_at: int | None = None) -> dict[str, torch.Tensor]:
    """The same task through a hand-written TrainLoop with background saves every 2 steps."""
    ddpkit.shutdown()
    ddpkit.init(seed=3, hang_timeout=0)
    model = ddpkit.prepare_model(dropout_model())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loop = ddpkit.TrainLoop({"model": model, "optimizer": opt}, folder, save_every_steps=2,
                            async_save=True)  # fmt: skip
    loader = ddpkit.prepare_loader(toy_dataset(), batch_size=8)
    for _epoch in loop.epochs(3):
        for x, y in loop.batches(loader):
            if loop.step + 1 == crash_at:
                raise Interrupted(f"crash before step {crash_at}")
            loop.backward(F.cross_entropy(model(x), y))
            loop.optimizer_step()
    return cpu_state(model)


def test_a_hand_written_loop_with_background_saves_resumes_to_the_same_parameters(
    tmp_path: Path,
) -> None:
    full = loop_train(tmp_path / "full")
    with pytest.raises(Interrupted):
        loop_train(tmp_path / "cut", crash_at=7)
    resumed = loop_train(tmp_path / "cut")
    assert all(torch.equal(tensor, resumed[name]) for name, tensor in full.items())
    written = [p.name for p in list_checkpoints(tmp_path / "cut")]
    assert written == [p.name for p in list_checkpoints(tmp_path / "full")]
