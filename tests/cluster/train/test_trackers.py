"""MLflow and W&B loggers against the real things: a local ``mlflow server`` (SQLite store)
started and stopped here, and W&B in offline mode, read back from its own files.

One 2-worker job (tests/scripts/tracked.py, 20 steps, a checkpoint every 3) logs to both;
it is killed with SIGKILL at step 13, with points after its newest checkpoint (step 12)
already sent, and run again to the end. Each tracker must then hold one run, every step once, and
the job's parameters.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.launch_helpers import REPO, SCRIPTS, processes_running
from helpers.mlflow_server import mlflow_server, server_processes

pytestmark = pytest.mark.cluster
mlflow = pytest.importorskip("mlflow", reason="the tracker tests need mlflow (make test has it)")
pytest.importorskip("wandb", reason="the tracker tests need wandb (make test has it)")

STEPS = list(range(1, 21))


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
def test_a_killed_and_resumed_job_is_one_run_with_every_step_once(tmp_path: Path) -> None:
    (tmp_path / "server").mkdir()
    with mlflow_server(tmp_path / "server") as uri:
        killed = _killed_at_step_13(_start(tmp_path, uri), uri, str(tmp_path / "ckpt"))
        finish = _start(tmp_path, uri)
        output = finish.communicate(timeout=300)[0]
        assert finish.returncode == 0, killed + output
        said = re.search(r"mlflow: continuing run (\w+) at step (\d+) .* up to step (\d+)", output)
        assert said and int(said.group(3)) > int(said.group(2)), output  # points were there
        _check_mlflow(uri, said.group(1))
    assert not server_processes(tmp_path / "server"), "the MLflow server outlived the test"
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
    from ddpkit.train.wandbfiles import history_rows, offline_run_files

    said = re.search(r"wandb: continuing run (\w+) at step (\d+)", output)
    assert said, output
    # W&B offline writes its file when the run finishes: the killed process's points are
    # lost to it, and come back from the CSV.
    assert re.search(r"wandb: \d+ earlier points it lacked sent again from the log_dir", output)
    files = offline_run_files(folder, said.group(1))
    assert len(files) == 2 and len(list(folder.glob("offline-run-*"))) == 2, files
    steps = [step for path in files for step, row in history_rows(path) if "train/loss" in row]
    assert sorted(steps) == STEPS, steps  # each step once, over the two processes' files
