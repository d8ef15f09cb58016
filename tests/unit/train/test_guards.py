"""The step guard's decisions and its exchange schedule, in a world of one (no processes)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
import torch

import ddpkit
import ddpkit.train.guard
from ddpkit.data.epochs import LoaderFacts
from ddpkit.train.guard import StepGuard


@pytest.fixture
def exchanges(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[float]]]:
    """Every all-reduce the guard makes, recorded (a world of one returns its input)."""
    ddpkit.init(hang_timeout=0)
    seen: list[list[float]] = []

    def recording(value: torch.Tensor) -> torch.Tensor:
        seen.append(value.tolist())
        return value

    monkeypatch.setattr(ddpkit.train.guard, "all_reduce_max", recording)
    yield seen


def test_exchanges_follow_rank0s_schedule(
    exchanges: list[list[float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = iter(float(t) for t in range(0, 10_000))  # one "second" per reading
    monkeypatch.setattr(ddpkit.train.guard.time, "monotonic", lambda: next(clock) * 0.01)
    guard = StepGuard("error", exchange_stops=True)
    for _ in range(300):
        guard.note_loss(torch.tensor(0.5))
        assert guard.check(collective=True).stop is None
    # The first boundary calibrates; rank 0 then spaces them about 1 s apart (~100 steps
    # at the 10 ms per boundary this clock shows).
    assert 2 <= len(exchanges) <= 5
    assert exchanges[1][-1] >= 50  # the interval rank 0 proposed


def test_a_stop_signal_is_agreed_at_the_next_due_exchange(exchanges: list[list[float]]) -> None:
    guard = StepGuard("error", exchange_stops=True)
    stops = [guard.check(collective=True, stop_signal=signal.SIGTERM).stop for _ in range(3)]
    # The first boundary exchanges at once; these steps are fast, so rank 0 puts the next
    # exchange far off and the next boundaries exchange nothing.
    assert stops == ["SIGTERM", None, None]
    assert len(exchanges) == 1 and exchanges[0][-2] == signal.SIGTERM


def test_without_a_checkpoint_dir_nothing_is_exchanged(exchanges: list[list[float]]) -> None:
    guard = StepGuard("error", exchange_stops=False)
    for _ in range(5):
        assert guard.check(collective=True, stop_signal=signal.SIGTERM).stop is None
    assert guard.epoch_end(signal.SIGTERM) is None
    assert exchanges == []


def test_an_uneven_epoch_exchanges_at_its_end_only(exchanges: list[list[float]]) -> None:
    guard = StepGuard("error", exchange_stops=True)
    guard._due = 10**6  # far away: only the forced end-of-epoch exchange can happen
    for _ in range(4):
        guard.check(collective=False, stop_signal=signal.SIGUSR1)
    assert exchanges == []
    assert guard.epoch_end(signal.SIGUSR1) == "SIGUSR1"
    assert len(exchanges) == 1


def test_skip_mode_exchanges_before_every_update(exchanges: list[list[float]]) -> None:
    guard = StepGuard("skip", exchange_stops=False)
    guard.note_loss(torch.tensor(0.5))
    assert guard.check(collective=True).nonfinite == {}
    guard.note_loss(torch.tensor(float("inf")))
    guard.note_loss(torch.tensor(0.5))  # a later finite micro-batch does not hide it
    assert guard.check(collective=True).nonfinite == {0: "inf"}
    assert len(exchanges) == 2


def test_error_mode_checks_the_loss_locally(exchanges: list[list[float]]) -> None:
    guard = StepGuard("error", exchange_stops=False)
    guard.note_loss(torch.tensor([1.0, float("nan")]))
    assert guard.check(collective=True).nonfinite == {0: "nan"}
    assert guard.check(collective=True).nonfinite == {}  # each step starts clean
    assert exchanges == []


def test_prepare_loaders_shards_are_taken_as_even_without_asking_the_ranks(monkeypatch) -> None:
    """Every rank's shard holds as many samples, so as many batches: no collective per epoch.
    A loader of the user's is still asked about."""
    asked: list[int | None] = []
    monkeypatch.setattr(
        ddpkit.train.guard, "uneven_shares", lambda _m, total, _p: asked.append(total)
    )
    model, data = torch.nn.Linear(1, 1), torch.utils.data.TensorDataset(torch.zeros(10, 1))
    ddpkit.init()
    try:
        prepared = ddpkit.prepare_loader(data, batch_size=4)
        in_step = LoaderFacts.of(prepared).ranks_in_step
        assert ddpkit.train.guard.even_epoch(model, in_step, 3, "error", 0, True) and asked == []
        plain = torch.utils.data.DataLoader(data, batch_size=4)
        in_step = LoaderFacts.of(plain).ranks_in_step
        assert ddpkit.train.guard.even_epoch(model, in_step, 3, "error", 0, True) and asked == [3]
    finally:
        ddpkit.shutdown()
