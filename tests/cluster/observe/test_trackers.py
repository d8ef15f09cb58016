"""MLflow and W&B loggers against the real things: a local ``mlflow server`` (SQLite store)
started and stopped here, and W&B in offline mode, read back from its own files.

One 2-worker job (tests/scripts/tracked.py, 20 steps, a checkpoint every 3) logs to both;
it is killed with SIGKILL at step 13, with points after its newest checkpoint (step 12)
already sent, and run again to the end. Each tracker must then hold one run, every step once, and
the job's parameters.

A resumed run whose parameters changed (another world size, another argument) keeps the first
values and records each new one beside them under ``<key> at step <N>``: checked on the same
server (started once for the module) and on W&B offline files, by driving the loggers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.launch_helpers import REPO, SCRIPTS, processes_running
from helpers.mlflow_server import mlflow_server, server_processes

pytestmark = pytest.mark.cluster
mlflow = pytest.importorskip("mlflow", reason="the tracker tests need mlflow (make test has it)")
pytest.importorskip("wandb", reason="the tracker tests need wandb (make test has it)")

STEPS = list(range(1, 21))

# The parameters of a run's first job, and of its job resumed at step 12 on another world size
# with another argument: two changed (one a ddpkit fact, one the user's), one the same.
FIRST = {"ddpkit/world_size": 2, "data": "v1", "lr": 0.05}
RESUMED = {"ddpkit/world_size": 1, "data": "v2", "lr": 0.05}
RESUMED_AT = 12


def changed_key(key: str, step: int) -> str:
    """The name a changed parameter is recorded under, as trackers.py documents it."""
    return f"{key} at step {step}"


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One tracking server for the module's tests (it takes seconds to start)."""
    folder = tmp_path_factory.mktemp("mlflow-server")
    with mlflow_server(folder) as uri:
        yield uri
    assert not server_processes(folder), "the MLflow server outlived the tests"


@pytest.fixture
def wandb_in_this_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """W&B used by the test's own process: its service stopped after, and the variable it sets
    to find the service (WANDB_SERVICE) removed, so later jobs do not inherit a dead one."""
    import wandb

    monkeypatch.delenv("WANDB_SERVICE", raising=False)  # undone after: absent again
    yield
    wandb.teardown()  # a second call, after the test's own, does nothing


def _start(tmp_path: Path, uri: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "ddpkit", "run", "--nproc", "2", str(SCRIPTS / "tracked.py"),
               str(tmp_path / "ckpt"), str(tmp_path / "wandb-files")]  # fmt: skip
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "WANDB_SILENT": "true"}
    return subprocess.Popen(command, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def _killed_at_step_13(job: subprocess.Popen[str], uri: str, needle: str) -> str:
    """SIGKILL the launcher and its workers at once when the server holds step 13
    (checkpoints every 3 steps): points after the newest checkpoint are in the trackers."""
    client, deadline = mlflow.MlflowClient(tracking_uri=uri), time.monotonic() + 180
    while _newest_step(client) < 13 and time.monotonic() < deadline:
        assert job.poll() is None, job.communicate()[0]
        time.sleep(0.02)
    for pid in processes_running(needle):  # workers too: they would stop and save if left
        os.kill(pid, signal.SIGKILL)
    return job.communicate(timeout=60)[0]


def _newest_step(client: mlflow.MlflowClient) -> int:
    experiment = client.get_experiment_by_name("tracked")
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    history = client.get_metric_history(runs[0].info.run_id, "train/loss") if runs else []
    return max((point.step for point in history), default=0)


@pytest.mark.timeout(600)
def test_a_killed_and_resumed_job_is_one_run_with_every_step_once(
    tmp_path: Path, mlflow_uri: str
) -> None:
    uri = mlflow_uri
    killed = _killed_at_step_13(_start(tmp_path, uri), uri, str(tmp_path / "ckpt"))
    finish = _start(tmp_path, uri)
    output = finish.communicate(timeout=300)[0]
    assert finish.returncode == 0, killed + output
    said = re.search(r"mlflow: continuing run (\w+) at step (\d+) .* up to step (\d+)", output)
    assert said and int(said.group(3)) > int(said.group(2)), output  # points were there
    _check_mlflow(uri, said.group(1))
    _check_wandb(tmp_path / "wandb-files" / "wandb", output)


def _check_mlflow(uri: str, run_id: str) -> None:
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tracked")
    runs = client.search_runs([experiment.experiment_id])
    assert [run.info.run_id for run in runs] == [run_id]
    for tag in ("train/loss", "train/lr"):
        assert sorted(p.step for p in client.get_metric_history(run_id, tag)) == STEPS, tag
    epochs = client.get_metric_history(run_id, "epoch/loss")
    assert sorted(p.step for p in epochs) == [5, 10, 15, 20]
    params = runs[0].data.params
    assert params["lr"] == "0.05" and params["ddpkit/world_size"] == "2", params
    assert params["ddpkit/global_batch"] == "16" and params["ddpkit/strategy"] == "ddp", params
    assert runs[0].info.status == "FINISHED"


def _check_wandb(folder: Path, output: str) -> None:
    from ddpkit.observe.wandbfiles import history_rows, offline_run_files

    said = re.search(r"wandb: continuing run (\w+) at step (\d+)", output)
    assert said, output
    # W&B offline writes its file when the run finishes: the killed process's points are
    # lost to it, and come back from the CSV.
    assert re.search(r"wandb: \d+ earlier points it lacked sent again from the log_dir", output)
    files = offline_run_files(folder, said.group(1))
    assert len(files) == 2 and len(list(folder.glob("offline-run-*"))) == 2, files
    steps = [step for path in files for step, row in history_rows(path) if "train/loss" in row]
    assert sorted(steps) == STEPS, steps  # each step once, over the two processes' files


def test_a_parameter_changed_on_resume_is_an_mlflow_tag_beside_the_first_value(
    mlflow_uri: str,
) -> None:
    from ddpkit.observe.trackers import MLflowLogger

    first = MLflowLogger(mlflow_uri, experiment="changed-params")
    first.start(None, step=0)
    first.log_params(FIRST, step=0)
    first.close()
    resumed = MLflowLogger(mlflow_uri, experiment="changed-params")
    resumed.start(first.run_id, step=RESUMED_AT)
    resumed.log_params(RESUMED, step=RESUMED_AT)
    resumed.close()
    assert resumed.run_id == first.run_id  # one run, as the user sees it in the UI
    run = mlflow.MlflowClient(tracking_uri=mlflow_uri).get_run(first.run_id)
    # MLflow cannot change a logged parameter: the first values stay, and each changed one is
    # a tag naming the step the job resumed from (the unchanged lr adds none).
    assert run.data.params == {"ddpkit/world_size": "2", "data": "v1", "lr": "0.05"}
    ours = {key: value for key, value in run.data.tags.items() if not key.startswith("mlflow.")}
    assert ours == {
        changed_key("ddpkit/world_size", RESUMED_AT): "1",
        changed_key("data", RESUMED_AT): "v2",
    }


def test_a_parameter_changed_on_resume_is_a_wandb_config_key_beside_the_first_value(
    tmp_path: Path, wandb_in_this_process: None
) -> None:
    import wandb

    from ddpkit.observe.trackers import WandbLogger

    first = WandbLogger(project="changed-params", mode="offline", dir=tmp_path)
    first.start(None, step=0)
    first.log_params(FIRST, step=0)
    first.close()
    # Each job's process ends, and W&B's service with it: only then are its files whole
    # (read right after finish(), a run's file is at times still empty).
    wandb.teardown()
    # W&B names an offline folder by its start second and the run's id: two starts of one
    # run in the same second share a folder (a fresh-clone make test saw it). A restarted job
    # is a new process that imports and meets first, so it never does; the test waits too.
    time.sleep(1.05 - time.time() % 1)
    resumed = WandbLogger(project="changed-params", mode="offline", dir=tmp_path)
    resumed.start(first.run_id, step=RESUMED_AT)
    resumed.log_params(RESUMED, step=RESUMED_AT)
    resumed.close()
    wandb.teardown()
    # What the run's config is once `wandb sync` has sent both folders: the first values kept,
    # each changed one beside them (the unchanged lr adds none).
    assert _synced_config(tmp_path / "wandb", str(first.run_id)) == {
        "ddpkit/world_size": "2",
        "data": "v1",
        "lr": "0.05",
        changed_key("ddpkit/world_size", RESUMED_AT): "1",
        changed_key("data", RESUMED_AT): "v2",
    }


def _synced_config(folder: Path, run_id: str) -> dict[str, Any]:
    """The config updates in every offline folder of ``run_id``, applied in order, as
    `wandb sync` replays them onto the one run (a later value of a key replaces the first)."""
    from wandb.proto import wandb_internal_pb2

    from ddpkit.observe.wandbfiles import _records, offline_run_files  # W&B's record format

    files = offline_run_files(folder, run_id)  # named by start time: oldest first
    assert len(files) == 2, f"one offline folder per process expected: {files}"
    config: dict[str, Any] = {}
    for path in files:
        for data in _records(path.read_bytes()):
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            record.ParseFromString(data)
            if record.WhichOneof("record_type") == "config":
                config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    return config
