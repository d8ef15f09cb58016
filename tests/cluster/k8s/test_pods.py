"""Kubernetes training pods for real, without Kubernetes: the controllers' contracts.

Each pod is a network namespace of this machine (:mod:`helpers.pods`): the pod's host name,
the job's headless-service names in its hosts file, one core of its own, and exactly the
variables its controller injects. Its command is the container's, ``ddpkit run
examples/wine.py ...`` with no node flags: the contract alone must bring the pods together.
Nothing outside the namespaces is contacted; skipped with the reason where namespaces cannot
be made (not root, no iproute2).

The judge is what ``ddpkit verify`` compares with: one process reading what the 2 ranks read
(the single-process reference, run as verify runs it), and, bit for bit, 2 workers on one
host (``ddpkit run --nproc 2``, one thread each as a one-core pod's worker has). The
references run in the background while the TrainJob's second pod waits for its master's name.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from ddpkit._core.protocol import (
    CHECK_REPLICAS_ENV,
    CHECKPOINT_DIR_ENV,
    LOG_DIR_ENV,
    MAX_STEPS_ENV,
    PREEMPTED_EXIT_CODE,
    REFERENCE_WORLD_ENV,
    VERIFY_DIR_ENV,
    WORKER_SETUP_ENV,
)
from ddpkit.checkpoint import list_checkpoints, load_checkpoint
from ddpkit.tools.doctor.podcheck import shm_bytes
from ddpkit.tools.verify.recorder import PARAMS_FILE, RECORD_FILE
from ddpkit.tools.verify.report import compare_states, default_tolerances, findings
from ddpkit.tools.verify.runner import RECORDER_SETUP, RunResult
from helpers.jobs import wait_until
from helpers.launch_helpers import REPO, metric_lines
from helpers.pods import PORT, PodProcess, pod_job, pods_running

pytestmark = pytest.mark.cluster

JOB = "wine"
MASTER = f"{JOB}-node-0-0.{JOB}"  # Trainer's PET_MASTER_ADDR; the JobSet pods derive it
STEPS = 12  # optimizer steps recorded, as `ddpkit verify --steps 12` (4 epochs of 3 steps)
WINE = ["examples/wine.py", "--epochs", "5"]
# Pod 1 finds no name for node 0 until it has waited this long, counted from its first
# look-up (after a start-up of about 5 s), as when the master pod's DNS record comes late.
UNPUBLISHED_S = 20.0
RESUME_EPOCHS = 40  # 120 steps, a checkpoint every 7: a stop lands mid-run
RESUMABLE = ["examples/wine.py", "--epochs", str(RESUME_EPOCHS), "--save-every-steps", "7"]
STOPPED = re.compile(r"workers stopped by SIGTERM at .+ after saving (\S+); run the same "
                     r"command again to resume \(exit code 75\)")  # fmt: skip


def recorder_env(folder: Path) -> dict[str, str]:
    """What `ddpkit verify` gives a run to record it (runner.run_side), under ``folder``."""
    return {
        VERIFY_DIR_ENV: str(folder),
        CHECKPOINT_DIR_ENV: str(folder / "checkpoints"),
        LOG_DIR_ENV: str(folder / "logs"),
        MAX_STEPS_ENV: str(STEPS),
        WORKER_SETUP_ENV: RECORDER_SETUP,
    }


def workers_env(folder: Path) -> dict[str, str]:
    """verify's N-worker side: the recorder, and the replicas compared after every step."""
    return {**recorder_env(folder), CHECK_REPLICAS_ENV: "1"}


def recorded(folder: Path) -> RunResult:
    """The record and the model states rank 0 wrote to ``folder``."""
    record = json.loads((folder / RECORD_FILE).read_text())
    states = torch.load(folder / PARAMS_FILE, map_location="cpu", weights_only=True)
    return RunResult(record, states)


class Background:
    """A reference run on this machine, started when first needed, in its own session."""

    def __init__(self, command: list[str], env: dict[str, str], folder: Path) -> None:
        self.command, self.env, self.folder = command, env, folder
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Background:
        if self.process is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            with (self.folder / "out").open("w") as out, (self.folder / "err").open("w") as err:
                self.process = subprocess.Popen(
                    self.command, cwd=REPO, env={**os.environ, **self.env}, stdout=out,
                    stderr=err, start_new_session=True,
                )  # fmt: skip
        return self

    def finish(self, timeout: float = 180) -> str:
        """Its stdout, once it ended well."""
        process = self.start().process
        assert process is not None
        code = process.wait(timeout=timeout)
        err = (self.folder / "err").read_text()
        assert code == 0, f"{' '.join(self.command)} failed ({code}):\n{err}"
        return (self.folder / "out").read_text()

    def stop(self) -> None:
        """Nothing of it left: its session, and the workers torch starts in sessions of
        their own (found by the folder in their command line or environment)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        for pid in _processes_mentioning(str(self.folder)):
            os.kill(pid, signal.SIGKILL)


def _processes_mentioning(needle: str) -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            text = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:  # ended while we looked
            continue
        if needle.encode() in text and int(proc.name) != os.getpid():
            found.append(int(proc.name))
    return found


@dataclass
class References:
    single: Background  # verify's single-process reference, standing in for 2 ranks
    two_workers: Background  # the same record from `ddpkit run --nproc 2` on one host
    uninterrupted: Background  # the resumable run with no stop, on one host

    def start_all(self) -> None:
        for run in (self.single, self.two_workers, self.uninterrupted):
            run.start()


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Iterator[References]:
    """The runs the pods must match, each started when first needed (the TrainJob fixture
    starts them all while a pod waits for DNS), stopped at the end of the module."""
    folder = tmp_path_factory.mktemp("references")
    one_thread = {"OMP_NUM_THREADS": "1"}  # what `ddpkit run` gives a one-core pod's worker
    run = [sys.executable, "-m", "ddpkit", "run", "--nproc", "2"]
    single_env = {**recorder_env(folder / "single"), REFERENCE_WORLD_ENV: "2"}
    runs = References(
        Background([sys.executable, "-m", "ddpkit.launch.worker", *WINE], single_env,
                   folder / "single"),
        Background([*run, *WINE], {**workers_env(folder / "two"), **one_thread}, folder / "two"),
        Background([*run, *RESUMABLE, "--checkpoint-dir", str(folder / "uninterrupted" / "ckpt")],
                   one_thread, folder / "uninterrupted"),
    )  # fmt: skip
    try:
        yield runs
    finally:
        for each in (runs.single, runs.two_workers, runs.uninterrupted):
            each.stop()


@dataclass
class PodsRun:
    """A finished job's pods: their outputs, exit codes, addresses, and rank 0's record."""

    pods: list[PodProcess]
    codes: list[int]
    addresses: list[str]
    record: RunResult | None

    def outputs(self) -> str:
        return "\n".join(f"--- {p.pod.name} ---\n{p.output}" for p in self.pods)


def run_pods(kind: str, folder: Path, references: References, late_dns: bool) -> PodsRun:
    """Two pods of ``kind`` training wine for STEPS steps, recorded as verify records;
    with ``late_dns``, pod 1 finds no name for node 0 until it waited UNPUBLISHED_S."""
    with pod_job(kind, JOB, 2) as job:
        if late_dns:
            job.hide(0, from_pod=1)
        env = [workers_env(folder / f"verify{i}") for i in (0, 1)]
        pods = [job.start(i, ["run", *WINE], folder, env=env[i]) for i in (0, 1)]
        if late_dns:
            waiting = f"waiting for {MASTER} to resolve"
            job.publish(0, to_pod=1, after_s=UNPUBLISHED_S, once=lambda: waiting in pods[1].stderr)
        references.start_all()  # on the cores the pods leave idle meanwhile
        codes = [pod.wait(180) for pod in pods]
        addresses = [pod.host.address for pod in job.pods]
    record = recorded(folder / "verify0") if codes == [0, 0] else None
    return PodsRun(pods, codes, addresses, record)


@pytest.fixture(scope="module")
def trainjob(references: References, tmp_path_factory: pytest.TempPathFactory) -> PodsRun:
    return run_pods("trainjob", tmp_path_factory.mktemp("trainjob"), references, late_dns=True)


@pytest.fixture(scope="module")
def jobset(references: References, tmp_path_factory: pytest.TempPathFactory) -> PodsRun:
    return run_pods("jobset", tmp_path_factory.mktemp("jobset"), references, late_dns=False)


def start_up_line(pod: PodProcess) -> str:
    lines = [line for line in pod.stderr.splitlines() if "worker(s) on this node" in line]
    assert len(lines) == 1, pod.output
    return lines[0]


def assert_computes_what_one_process_computes(run: PodsRun, references: References) -> None:
    assert run.codes == [0, 0], run.outputs()
    assert run.record is not None
    pods = run.record
    # The comparison is bit for bit only at the same thread count as the one-host run.
    assert all("OMP_NUM_THREADS=1" in start_up_line(p) for p in run.pods), run.outputs()
    assert "world size 2 (1 process per node x 2 nodes)" in run.pods[0].stdout

    # verify's judgement against one process: same steps, batch and samples, replicas
    # identical at every step, every tensor within fp32's tolerances.
    single_out = references.single.finish()
    single = recorded(references.single.folder)
    rtol, atol = default_tolerances("fp32")
    initial = compare_states(pods.states["initial"], single.states["initial"], 0.0, 0.0)
    final = compare_states(pods.states["final"], single.states["final"], rtol, atol)
    checks = findings(pods.record, single.record, initial, final, f"rtol {rtol:g} + atol {atol:g}")
    assert all(check.ok for check in checks), [check for check in checks if not check.ok]
    assert pods.record["steps"] == single.record["steps"] == STEPS
    assert pods.record["samples"] == single.record["samples"]  # each sample's bytes, by index
    assert pods.record["replicas"]["checked"] and pods.record["replicas"]["divergence"] is None
    assert metric_lines(run.pods[0].stdout) == metric_lines(single_out)
    assert len(metric_lines(single_out)) >= 3

    # Bit for bit what 2 workers compute on one host: the network between pods adds nothing.
    references.two_workers.finish()
    two = recorded(references.two_workers.folder)
    exact = compare_states(pods.states["final"], two.states["final"], 0.0, 0.0)
    assert all(diff.max_abs == 0.0 for diff in exact), [d.row() for d in exact]
    assert pods.record["samples"] == two.record["samples"]
    assert pods.record["replicas"] == two.record["replicas"]


def assert_each_pod_names(run: PodsRun, contract: str) -> None:
    """Every pod trained, and its start-up line names the contract it read (``contract``
    with {job}, {rank} and {master} filled in)."""
    assert run.codes == [0, 0], run.outputs()
    for rank, pod in enumerate(run.pods):
        line = start_up_line(pod)
        assert line.startswith("ddpkit run: 1 worker(s) on this node"), line
        assert contract.format(job=JOB, rank=rank, master=f"{MASTER}:{PORT}") in line, line


# -- Kubeflow Trainer v2 TrainJob -----------------------------------------------------------


@pytest.mark.timeout(300)  # with the module's references, run meanwhile
def test_trainjob_pods_meet_from_the_controllers_variables_alone(trainjob: PodsRun) -> None:
    assert_each_pod_names(trainjob, "Kubeflow TrainJob {job}: node {rank} of 2 (PET_NNODES, "
                          "PET_NODE_RANK), master {master}")  # fmt: skip


@pytest.mark.timeout(300)
def test_a_pod_waits_for_its_masters_name_to_be_published(trainjob: PodsRun) -> None:
    assert trainjob.codes == [0, 0], trainjob.outputs()
    late = trainjob.pods[1].stderr
    waits = re.findall(rf"waiting for {re.escape(MASTER)} to resolve \(.+\); (\d+) s left", late)
    assert len(waits) >= 2, late  # at once, and every 10 s while it waits
    assert int(waits[0]) >= 119 and int(waits[1]) <= int(waits[0]) - 9, waits
    resolved = re.search(rf"{re.escape(MASTER)} resolves to (\S+) after (\d+) s", late)
    assert resolved, late
    assert resolved[1] == trainjob.addresses[0]
    assert int(resolved[2]) >= UNPUBLISHED_S
    assert "waiting for" not in trainjob.pods[0].stderr  # node 0 knew its own name at once


@pytest.mark.timeout(300)
def test_trainjob_pods_compute_what_one_process_computes(
    trainjob: PodsRun, references: References
) -> None:
    assert_computes_what_one_process_computes(trainjob, references)


# -- JobSet (as `ddpkit k8s --kind jobset` writes it) -----------------------------------------


@pytest.mark.timeout(300)
def test_jobset_pods_find_node_0_from_their_host_names(jobset: PodsRun) -> None:
    assert_each_pod_names(jobset, "JobSet {job}: node {rank} of 2 (JOB_COMPLETION_INDEX, "
                          "HOSTNAME, PET_NNODES), master {master}")  # fmt: skip


@pytest.mark.timeout(300)
def test_jobset_pods_compute_what_one_process_computes(
    jobset: PodsRun, references: References
) -> None:
    assert_computes_what_one_process_computes(jobset, references)


# -- a pod's life: deleted, recreated elsewhere ---------------------------------------------


@pytest.mark.timeout(300)
def test_pods_deleted_and_recreated_with_new_addresses_resume_exactly(
    references: References, tmp_path: Path
) -> None:
    references.uninterrupted.start()
    checkpoints = tmp_path / "checkpoints"  # every pod sees it: a ReadWriteMany volume
    command = ["run", *RESUMABLE, "--checkpoint-dir", str(checkpoints)]
    with pod_job("trainjob", JOB, 2, grace_s=20) as job:
        first = [job.start(i, command, tmp_path / "first") for i in (0, 1)]

        def saved_or_ended() -> bool:
            return bool(list_checkpoints(checkpoints)) or any(
                p.process.poll() is not None for p in first
            )

        wait_until(saved_or_ended, 150, "a first checkpoint")
        codes = job.delete(first)  # SIGTERM to each pod's ddpkit run, SIGKILL after 20 s
        outputs = "\n".join(f"--- {p.pod.name} ---\n{p.output}" for p in first)
        assert codes == [PREEMPTED_EXIT_CODE] * 2, outputs
        saved = [STOPPED.search(pod.stderr) for pod in first]
        assert saved[0] and saved[1] and saved[0][1] == saved[1][1], outputs
        assert all(pods_running(pod.host) == [] for pod in job.pods)

        before = [pod.host.address for pod in job.pods]
        after = [job.recreate(i).host.address for i in (0, 1)]
        assert not set(before) & set(after), (before, after)
        second = [job.start(i, command, tmp_path / "second") for i in (0, 1)]
        assert [pod.wait(180) for pod in second] == [0, 0], [p.output for p in second]

    resumed = second[0].stdout
    assert f"resumed from {saved[0][1]}" in resumed, resumed
    whole = metric_lines(references.uninterrupted.finish())
    tail = metric_lines(resumed)
    assert len(tail) >= 2 and tail == whole[-len(tail) :]
    final = f"epoch_{RESUME_EPOCHS:06d}.pt"
    model = load_checkpoint(checkpoints / final)["model"]
    expected = load_checkpoint(references.uninterrupted.folder / "ckpt" / final)["model"]
    assert model.keys() == expected.keys()
    assert all(torch.equal(model[name], expected[name]) for name in model)


# -- doctor in a pod ----------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_doctor_in_a_pod_names_a_64_mib_dev_shm(tmp_path: Path) -> None:
    before = shm_bytes()
    with pod_job("trainjob", JOB, 2) as job:
        doctor = job.start(0, ["doctor"], tmp_path, shm="64m")  # a container's default size
        code = doctor.wait(90)
    report = doctor.output
    assert code == 1, report
    assert re.search(r"^FAIL  shared memory: /dev/shm is 64 MiB; ", report, re.MULTILINE), report
    assert "emptyDir: {medium: Memory" in report  # the fix, for the pod spec
    assert "ranks from the Kubeflow TrainJob" in report  # it knew where it ran
    assert shm_bytes() == before  # the small /dev/shm stayed in the pod's mount namespace
