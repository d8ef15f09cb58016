"""ddpkit's SLURM support against a real one-node cluster: sbatch, srun, scancel, requeue.

Every job here is what a user would submit, run by real slurmctld/slurmd daemons; the tests
read what users read: the job's state from scontrol and its output file.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from ddpkit.checkpoint import load_checkpoint
from ddpkit.tools.slurm.script import SbatchOptions, sbatch_script
from helpers.launch_helpers import REPO, folder_names, metric_lines, worker_lines
from helpers.slurm_cluster import SlurmCluster

# The first test may install munge and SLURM (apt-get) and start the cluster.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

WINE = ["examples/wine.py", "--epochs", "5"]
ONE_NODE_TWO_WORKERS = ["--nproc-per-node", "2", "--cpus-per-task", "2"]
SAVED = re.compile(r"after saving (\S+\.pt);")


def ddpkit_slurm(cluster: SlurmCluster, tmp_path: Path, *args: str) -> Path:
    """`ddpkit slurm ARGS > job.sh`, run where the cluster's sinfo answers."""
    done = cluster.command("ddpkit", "slurm", *args, cwd=REPO)
    assert done.returncode == 0, done.stderr
    script = tmp_path / "job.sh"
    script.write_text(done.stdout)
    return script


def batch_script(tmp_path: Path, directives: list[str], body: str) -> Path:
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives), body]
    script = tmp_path / "job.sh"
    script.write_text("\n".join(lines) + "\n")
    return script


def submit(cluster: SlurmCluster, script: Path, tmp_path: Path) -> tuple[int, Path]:
    """sbatch from the repository, as a user would; returns the job id and its output file."""
    job = cluster.sbatch(script, f"--output={tmp_path}/job-%j.out", cwd=REPO)
    return job, tmp_path / f"job-{job}.out"


def run_job(cluster: SlurmCluster, script: Path, tmp_path: Path) -> tuple[dict[str, str], str]:
    job, output = submit(cluster, script, tmp_path)
    info = cluster.wait(job, timeout=240)
    return info, output.read_text()


def wait_for_line(output: Path, prefix: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if output.exists() and any(
            line.startswith(prefix) for line in worker_lines(output.read_text())
        ):
            return
        time.sleep(0.2)
    text = output.read_text() if output.exists() else "(no output yet)"
    raise AssertionError(f"no line starting {prefix!r} within {timeout} s:\n{text}")


def test_the_sbatch_script_of_ddpkit_slurm_trains(
    cluster: SlurmCluster, tmp_path: Path, wine_reference: list[str]
) -> None:
    checkpoints = tmp_path / "ck"
    script = ddpkit_slurm(cluster, tmp_path, *ONE_NODE_TWO_WORKERS, *WINE,
                          "--checkpoint-dir", str(checkpoints))  # fmt: skip
    info, out = run_job(cluster, script, tmp_path)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), out
    assert "world size 2 (2 processes per node x 1 node)" in out
    assert "(36 samples, 2 workers)" in out
    assert metric_lines(out) == wine_reference
    assert out.count("ddpkit: saved ") == 1  # rank 0 alone writes, once
    assert folder_names(checkpoints) == ["epoch_000005.pt"]


def test_srun_per_worker_and_per_node_train_alike(
    cluster: SlurmCluster, wine_reference: list[str]
) -> None:
    per_worker = cluster.command("srun", "-n", "2", sys.executable, *WINE, cwd=REPO, timeout=180)
    assert per_worker.returncode == 0, per_worker.stderr
    assert "world size 2 (2 processes per node x 1 node)" in per_worker.stdout
    assert "ranks from SLURM_PROCID" in per_worker.stdout  # World read SLURM's variables
    per_node = cluster.command("srun", "-n", "1", "ddpkit", "run", "--nproc", "2", *WINE,
                               cwd=REPO, timeout=180)  # fmt: skip
    assert per_node.returncode == 0, per_node.stderr
    assert "ranks from" not in per_node.stdout  # ddpkit run assigned them
    assert metric_lines(per_worker.stdout) == metric_lines(per_node.stdout) == wine_reference


def test_scancel_leaves_a_checkpoint_a_resubmitted_job_resumes(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "ck"
    script = ddpkit_slurm(cluster, tmp_path, *ONE_NODE_TWO_WORKERS, "examples/wine.py",
                          "--epochs", "250", "--checkpoint-dir", str(checkpoints))  # fmt: skip
    job, output = submit(cluster, script, tmp_path)
    wait_for_line(output, "epoch 3/")
    assert cluster.command("scancel", str(job)).returncode == 0  # SIGTERM to every task
    info = cluster.wait(job, timeout=90)
    out = output.read_text()
    assert info["JobState"] == "CANCELLED", out
    assert "workers stopped by SIGTERM" in out
    saved = Path(SAVED.findall(out)[-1])
    assert saved.parent == checkpoints
    assert load_checkpoint(saved)["epoch"] >= 3  # whole and verified (SHA-256)

    info, again = run_job(cluster, script, tmp_path)  # the same script, submitted again
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), again
    assert f"ddpkit: resumed from {saved}" in again
    assert "epoch 250/250" in again and "epoch 1/250" not in again


def test_requeue_on_75_resumes_in_the_same_job(cluster: SlurmCluster, tmp_path: Path) -> None:
    script = ddpkit_slurm(cluster, tmp_path, "--requeue", *ONE_NODE_TWO_WORKERS,
                          "examples/wine.py", "--epochs", "250",
                          "--checkpoint-dir", str(tmp_path / "ck"))  # fmt: skip
    job, output = submit(cluster, script, tmp_path)
    wait_for_line(output, "epoch 3/")
    # What `#SBATCH --signal=USR1@120` does two minutes before the time limit.
    assert cluster.command("scancel", "--signal=USR1", str(job)).returncode == 0
    info = cluster.wait(job, timeout=240, states=("COMPLETED", "FAILED", "CANCELLED"))
    out = output.read_text()  # both runs, appended
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), out
    assert "workers stopped by SIGUSR1" in out
    assert f"ddpkit: resumed from {SAVED.findall(out)[-1]}" in out
    assert out.count("test accuracy") == 1


@pytest.mark.parametrize(
    ("directives", "body", "error"),
    [
        pytest.param(["--ntasks=2"], "python examples/wine.py",
                     r"ddpkit.errors.ConfigError: SLURM_NTASKS=2 but this process is job \d+'s "
                     r"batch script.*`srun python train.py`", id="batch-script-without-srun"),
        pytest.param(["--ntasks=2"], "srun ddpkit run --nproc 2 examples/wine.py",
                     r"ddpkit run: error: this SLURM step has 2 tasks on 1 node\(s\)",
                     id="two-tasks-on-the-node-each-running-ddpkit-run"),
        pytest.param(["--ntasks-per-node=1"], "srun ddpkit run --nproc 2 examples/missing.py",
                     r"ddpkit run: error: script examples/missing.py does not exist",
                     id="missing-script"),
    ],
)  # fmt: skip
def test_a_misconfigured_job_fails_with_ddpkits_error(
    cluster: SlurmCluster, tmp_path: Path, directives: list[str], body: str, error: str
) -> None:
    info, out = run_job(cluster, batch_script(tmp_path, directives, body), tmp_path)
    assert info["JobState"] == "FAILED", out
    assert re.search(error, out), out
    assert "Traceback" not in out  # the message and the user's line, not ddpkit's stack


def test_more_cpus_than_the_node_has_is_refused_before_sbatch(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    asked = ["--nproc-per-node", "4", *WINE]  # 4 CPUs per worker by default: 16 on 2 cores
    refused = cluster.command("ddpkit", "slurm", *asked, cwd=REPO)
    assert refused.returncode == 2
    assert "for 16 CPUs, but partition debug's nodes have at most" in refused.stderr
    # Why: sbatch takes such a job and leaves it pending for ever.
    unchecked = sbatch_script(SbatchOptions(nproc_per_node=4), WINE[0], WINE[1:])
    (tmp_path / "job.sh").write_text(unchecked)
    job, _ = submit(cluster, tmp_path / "job.sh", tmp_path)
    time.sleep(2)
    info = cluster.job(job)
    assert (info["JobState"], info["Reason"]) == ("PENDING", "PartitionConfig")


def test_two_nodes_train_as_one_and_resume_after_scancel(
    two_node_slurm: SlurmCluster, tmp_path: Path, wine_reference: list[str]
) -> None:
    """`ddpkit slurm --nodes 2` on two slurmd hosts: the master is the node list's first host,
    node ranks come from SLURM, and the job equals the same job on one node epoch by epoch;
    cancelled, it leaves a checkpoint the same script, submitted again, resumes."""
    cluster, checkpoints = two_node_slurm, tmp_path / "ck"
    two_nodes = ["--nodes", "2", "--nproc-per-node", "1", "--cpus-per-task", "1"]
    script = ddpkit_slurm(cluster, tmp_path, *two_nodes, *WINE, "--checkpoint-dir",
                          str(checkpoints), "--save-every", "1")  # fmt: skip
    info, out = run_job(cluster, script, tmp_path)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), out
    assert info["NodeList"] == "dknode[1-2]"
    assert "world size 2 (1 process per node x 2 nodes)" in out
    assert "master dknode1:" in out  # the first host of SLURM_JOB_NODELIST
    assert metric_lines(out) == wine_reference

    long_run = ddpkit_slurm(cluster, tmp_path, *two_nodes, "examples/wine.py", "--epochs",
                            "250", "--checkpoint-dir", str(tmp_path / "long"))  # fmt: skip
    job, output = submit(cluster, long_run, tmp_path)
    wait_for_line(output, "epoch 3/")
    assert cluster.command("scancel", str(job)).returncode == 0  # SIGTERM to both nodes
    assert cluster.wait(job, timeout=90)["JobState"] == "CANCELLED", output.read_text()
    saved = Path(SAVED.findall(output.read_text())[-1])
    info, again = run_job(cluster, long_run, tmp_path)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), again
    assert f"ddpkit: resumed from {saved}" in again and "epoch 250/250" in again
    assert cluster.job_processes() == []  # no task or step left running on either node


def test_doctor_nodes_measures_the_link_between_two_slurm_nodes(
    two_node_slurm: SlurmCluster,
) -> None:
    """`srun` one task per node of `ddpkit doctor --nodes`: the hosts are SLURM's nodes."""
    done = two_node_slurm.command(
        "srun", "--nodes", "2", "--ntasks-per-node", "1", sys.executable, "-m", "ddpkit",
        "doctor", "--nodes", "--link-mib", "1", cwd=REPO, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "links between 2 hosts (gloo, 1 MiB messages)" in done.stdout, done.stdout
    link = re.search(r"dknode1 \(\S+\) <-> dknode2 \(\S+\): ([\d.]+) MB/s", done.stdout)
    assert link and float(link[1]) > 10, done.stdout
    assert "PASS one link" in done.stdout
