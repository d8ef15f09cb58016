"""The tracker loggers' bookkeeping, on an in-memory tracker: what is sent, skipped, kept
after a failure, filled in from the CSV; the run id through a checkpoint; bad specs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pytest
import torch
import torch.nn.functional as F

import ddpkit
from ddpkit.errors import ConfigError
from ddpkit.observe.trackers import Point, Tracker, tracker_from
from helpers.mp_workers import toy_dataset, toy_model


class Memory(Tracker):
    """A tracker server in a dict: runs -> points, params, status."""

    name = "memory"
    runs: ClassVar[dict[str, dict[str, Any]]] = {}

    def __init__(self, fail_sends: int = 0, **options: Any) -> None:
        super().__init__(**options)
        self.fail_sends = fail_sends

    def _open(self, run_id: str | None) -> tuple[str, dict[str, int]]:
        if run_id is None:
            run_id = f"run{len(self.runs)}"
            self.runs[run_id] = {"points": [], "params": {}, "tags": {}, "status": "RUNNING"}
        held: dict[str, int] = {}
        for tag, _, step, _ in self.runs[run_id]["points"]:
            held[tag] = max(held.get(tag, step), step)
        return run_id, held

    def _send(self, points: Sequence[Point]) -> None:
        if self.fail_sends:
            self.fail_sends -= 1
            raise ConnectionError("server away")
        self.runs[str(self.run_id)]["points"].extend(points)

    # Only storage: which parameters are new, which changed and what a change is named is
    # Tracker.log_params's rule, the one under test.
    def _held_params(self) -> dict[str, str]:
        return dict(self.runs[str(self.run_id)]["params"])

    def _add_params(self, params: Mapping[str, str]) -> None:
        self.runs[str(self.run_id)]["params"].update(params)

    def _note_changed(self, changed: Mapping[str, str]) -> None:
        self.runs[str(self.run_id)]["tags"].update(changed)

    def _finish(self, failed: bool) -> None:
        self.runs[str(self.run_id)]["status"] = "FAILED" if failed else "FINISHED"

    def steps(self, tag: str) -> list[int]:
        return [step for t, _, step, _ in self.runs[str(self.run_id)]["points"] if t == tag]


def test_a_resumed_run_skips_the_steps_it_holds_and_sends_the_rest() -> None:
    first = Memory(flush_every=0)
    first.start(None, step=0)
    for step in range(1, 8):
        first.log({"train/loss": 1.0 / step}, step)  # killed after step 7; checkpoint at 5
    again = Memory(flush_every=0)
    again.start(first.run_id, step=5)
    for step in range(6, 11):
        again.log({"train/loss": 1.0 / step, "epoch/loss": 0.1}, step)
    again.close()
    assert again.steps("train/loss") == list(range(1, 11))
    assert again.steps("epoch/loss") == list(range(6, 11))  # a tag the run lacked: all sent
    assert Memory.runs[str(again.run_id)]["status"] == "FINISHED"


def test_points_a_failed_send_kept_go_at_the_next_flush(caplog: pytest.LogCaptureFixture) -> None:
    tracker = Memory(fail_sends=1, flush_every=3600)
    tracker.start(None, step=0)
    tracker.log({"train/loss": 0.5}, 1)
    tracker.flush()
    assert "1 points not sent (server away)" in caplog.text and tracker.steps("train/loss") == []
    tracker.log({"train/loss": 0.4}, 2)
    tracker.flush()
    assert tracker.steps("train/loss") == [1, 2]


def test_points_the_tracker_lost_are_filled_in_from_the_csv_rows() -> None:
    tracker = Memory(flush_every=0)
    tracker.start(None, step=0)
    tracker.log({"train/loss": 1.0}, 1)  # a tracker that lost steps 2 and 3 of a killed run
    resumed = Memory(flush_every=0)
    resumed.start(tracker.run_id, step=3)
    rows = [["1", "train/loss", "1.0", "10.0"], ["3", "train/loss", "0.3", "12.0"],
            ["2", "train/loss", "0.5", "11.0"]]  # fmt: skip
    resumed.fill_in(rows)
    assert resumed.steps("train/loss") == [1, 2, 3]


def test_a_changed_fact_is_recorded_beside_the_first_value() -> None:
    tracker = Memory()
    tracker.start(None, step=0)
    tracker.log_params({"ddpkit/world_size": 2, "lr": 0.1, "none": None}, step=0)
    again = Memory()
    again.start(tracker.run_id, step=40)
    again.log_params({"ddpkit/world_size": 3, "lr": 0.1}, step=40)
    run = Memory.runs[str(tracker.run_id)]
    assert run["params"] == {"ddpkit/world_size": "2", "lr": "0.1"}
    assert run["tags"] == {"ddpkit/world_size at step 40": "3"}


def test_the_run_id_travels_in_the_checkpoint_and_the_facts_are_logged(tmp_path: Any) -> None:
    def fit(epochs: int) -> Memory:
        ddpkit.init(seed=0, hang_timeout=0)
        model = ddpkit.prepare_model(toy_model())
        tracker = Memory(params={"lr": 0.1})
        trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                 F.cross_entropy, tmp_path, loggers=[tracker])  # fmt: skip
        trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=8), epochs=epochs)
        ddpkit.shutdown()
        return tracker

    first, second = fit(1), fit(2)
    assert first.run_id == second.run_id
    assert second.steps("train/loss") == list(range(1, 11))
    params = Memory.runs[str(first.run_id)]["params"]
    assert params["lr"] == "0.1" and params["ddpkit/world_size"] == "1", params


def test_bad_logger_specs_are_named() -> None:
    with pytest.raises(ConfigError, match="unknown tracker 'comet'"):
        tracker_from("comet")
    with pytest.raises(ConfigError, match=r"loggers must be a list, like \['mlflow'\]"):
        ddpkit.Trainer(toy_model(), None, loggers="mlflow")  # type: ignore[arg-type]


def test_trainloop_log_reaches_the_trackers_without_a_log_dir() -> None:
    ddpkit.init(seed=0, hang_timeout=0)
    model = ddpkit.prepare_model(toy_model())
    tracker = Memory(flush_every=0)
    state = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}
    loop = ddpkit.TrainLoop(state, loggers=[tracker])
    loop.log({"custom/value": 3.0})
    assert tracker.steps("custom/value") == [0]
    ddpkit.shutdown()


def test_a_run_id_the_mlflow_server_lacks_starts_a_new_run(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("mlflow", reason="needs mlflow (make test installs it)")
    from ddpkit.observe.trackers import MLflowLogger

    tracker = MLflowLogger(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker.start("0123456789abcdef0123456789abcdef", step=5)  # another server's run
    assert tracker.run_id != "0123456789abcdef0123456789abcdef"
    assert "is not on sqlite:" in caplog.text and "continues in a new run" in caplog.text
    tracker.log({"train/loss": 0.5}, 6)
    tracker.close()
    history = tracker._client.get_metric_history(tracker.run_id, "train/loss")
    assert [(p.step, p.value) for p in history] == [(6, 0.5)]
