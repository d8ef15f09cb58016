"""Progress to a Kubeflow TrainJob's status endpoint: rank 0 POSTs to a local HTTPS server
whose certificate a self-signed CA signed, as the Trainer's status server does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import ddpkit
from ddpkit.observe.trainjobstatus import CA_ENV, TOKEN_ENV, URL_ENV, RunPosition, TrainJobStatus
from helpers.https_server import make_certificates, status_server


def _train(epochs: int) -> None:
    ddpkit.init()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    model = ddpkit.prepare_model(torch.nn.Linear(4, 2))
    trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                             loss_fn=F.cross_entropy)  # fmt: skip
    trainer.fit(ddpkit.prepare_loader(data, batch_size=16), epochs=epochs)


def test_a_run_reports_progress_and_metrics_to_the_trainjob(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("the-service-account-token\n")
    with status_server(tmp_path) as server:
        monkeypatch.setenv(URL_ENV, server.url)
        monkeypatch.setenv(CA_ENV, str(server.ca_file))
        monkeypatch.setenv(TOKEN_ENV, str(token))
        _train(epochs=3)
    assert server.received, "no report reached the endpoint"
    first, last = server.received[0], server.received[-1]
    assert last["path"].endswith("/namespaces/default/trainjobs/wine/status")
    assert last["headers"]["Authorization"] == "Bearer the-service-account-token"
    status = last["body"]["trainerStatus"]
    assert status["progressPercentage"] == 100 and status["estimatedRemainingSeconds"] == 0
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", status["lastUpdatedTime"])
    metrics = {m["name"]: m["value"] for m in status["metrics"]}
    assert metrics["epoch"] == "3" and float(metrics["loss"]) > 0  # values are strings
    assert first["body"]["trainerStatus"]["progressPercentage"] < 100


def test_progress_counts_epochs_and_batches_and_posts_at_most_every_few_seconds(
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    now = [0.0]
    with status_server(tmp_path) as server:
        where = RunPosition(epoch=1, epochs=4, done=5, total=10)  # as the loop says
        status = TrainJobStatus(server.url, str(server.ca_file), str(token), lambda: where,
                                every_s=5.0, clock=lambda: now[0])  # fmt: skip
        assert status.position().fraction() == pytest.approx(1.5 / 4)
        status.report({"loss": 0.5})
        now[0] = 2.0
        status.report({"loss": 0.4})  # 2 s after the last post: kept for the next
        status.close(finished=False)
    bodies = [r["body"]["trainerStatus"] for r in server.received]
    assert [b["progressPercentage"] for b in bodies] == [37, 37]
    assert [b["metrics"] for b in bodies] == [[{"name": "loss", "value": "0.5"}],
                                             [{"name": "loss", "value": "0.4"}]]  # fmt: skip


def test_an_endpoint_the_ca_did_not_sign_is_warned_about_once_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    other_ca, _, _ = make_certificates(tmp_path, issuer="another-ca")
    token = tmp_path / "token"
    token.write_text("t")
    with status_server(tmp_path) as server:
        monkeypatch.setenv(URL_ENV, server.url)
        monkeypatch.setenv(CA_ENV, str(other_ca))
        monkeypatch.setenv(TOKEN_ENV, str(token))
        _train(epochs=2)
    assert server.received == []
    warnings = [r.message for r in caplog.records if "could not report progress" in r.message]
    assert len(warnings) == 1 and "CERTIFICATE_VERIFY_FAILED" in warnings[0]
