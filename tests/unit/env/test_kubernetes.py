"""Each Kubernetes controller's contract, with the exact variables it injects (read from the
controllers' sources; docs/kubernetes.md), read as the same frozen value (no processes)."""

from __future__ import annotations

import pytest

from ddpkit import ConfigError
from ddpkit.env.kubernetes import Controller, detect_pod_job
from ddpkit.env.world import World, detect_topology

# Kubeflow Trainer v2's torch plugin (pkg/runtime/framework/plugins/torch/torch.go)
TRAINJOB = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1",
            "PET_MASTER_ADDR": "wine-node-0-0.wine", "PET_MASTER_PORT": "29500",
            "JOB_COMPLETION_INDEX": "1", "HOSTNAME": "wine-node-0-1"}  # fmt: skip
# Training Operator v1.9 (pkg/controller.v1/pytorch/envvar.go): pod 1 of a master + 1 worker
PYTORCHJOB = {"MASTER_ADDR": "wine-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2",
              "RANK": "1", "PYTHONUNBUFFERED": "1", "PET_NNODES": "2", "PET_NODE_RANK": "1",
              "PET_MASTER_ADDR": "wine-master-0", "PET_MASTER_PORT": "23456",
              "PET_NPROC_PER_NODE": "auto"}  # fmt: skip
PYTORCHJOB_ELASTIC = {"PET_RDZV_ENDPOINT": "wine-worker-0:23456", "PET_RDZV_BACKEND": "c10d",
                      "PET_NNODES": "2:4", "PET_NPROC_PER_NODE": "auto",
                      "PET_MAX_RESTARTS": "3", "PYTHONUNBUFFERED": "1"}  # fmt: skip
# a JobSet sets nothing: the indexed Job's completion index and the pod's host name
JOBSET = {"JOB_COMPLETION_INDEX": "1", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "1",
          "PET_MASTER_PORT": "29500"}  # fmt: skip
JOBSET_FQDN = "wine-node-0-1.wine.default.svc.cluster.local"
# Volcano's svc and env plugins as TorchX lays them out: one task per replica
TORCHX = {"VC_TRAINER_0_HOSTS": "app-7-trainer-0-0.app-7", "VC_TRAINER_0_NUM": "1",
          "VC_TRAINER_1_HOSTS": "app-7-trainer-1-0.app-7", "VC_TRAINER_1_NUM": "1",
          "VC_TASK_INDEX": "0", "VK_TASK_INDEX": "0",
          "TORCHX_JOB_ID": "kubernetes://torchx/default:app-7"}  # fmt: skip
VOLCANO = {"VC_WORKER_HOSTS": "job-worker-0.job,job-worker-1.job,job-worker-2.job",
           "VC_WORKER_NUM": "3", "VC_TASK_INDEX": "2"}  # fmt: skip


@pytest.mark.parametrize(
    ("env", "host", "expected"),
    [
        (TRAINJOB, None, (Controller.TRAINJOB, "wine", "2", 1, "wine-node-0-0.wine:29500")),
        (PYTORCHJOB, None, (Controller.PYTORCHJOB, "wine", "2", 1, "wine-master-0:23456")),
        (
            PYTORCHJOB_ELASTIC,
            None,
            (Controller.PYTORCHJOB, "wine", "2:4", None, "wine-worker-0:23456"),
        ),
        (JOBSET, "wine-node-0-1", (Controller.JOBSET, "wine", "2", 1, "wine-node-0-0.wine:29500")),
        (
            TORCHX,
            "app-7-trainer-1-0",
            (Controller.TORCHX, "app-7", "2", 1, "app-7-trainer-0-0.app-7:29500"),
        ),
        (VOLCANO, "job-worker-2", (Controller.VOLCANO, "job", "3", 2, "job-worker-0.job:29500")),
    ],
    ids=["trainjob", "pytorchjob", "pytorchjob-elastic", "jobset", "torchx", "volcano"],
)
def test_each_controllers_variables_are_recognised(
    env: dict, host: str | None, expected: tuple
) -> None:
    job = detect_pod_job(env, hostname=host, fqdn=JOBSET_FQDN if env is JOBSET else None)
    assert job is not None
    assert (job.controller, job.name, job.nnodes, job.node_rank, job.master) == expected


def test_the_start_up_clause_says_which_contract_and_which_variables() -> None:
    job = detect_pod_job(TRAINJOB)
    assert job is not None
    assert job.describe() == ("Kubeflow TrainJob wine: node 1 of 2 (PET_NNODES, PET_NODE_RANK), "
                              "master wine-node-0-0.wine:29500")  # fmt: skip


def test_no_contract_outside_a_pod_and_for_an_indexed_job_of_single_pods() -> None:
    assert detect_pod_job({}, hostname="laptop") is None
    assert detect_pod_job({"JOB_COMPLETION_INDEX": "3"}, hostname="sweep-3") is None
    assert detect_pod_job({"VC_PS_HOSTS": "j-ps-0.j"}, hostname="j-worker-0") is None


def test_a_jobset_pod_without_a_jobset_host_name_is_told_what_to_set() -> None:
    with pytest.raises(
        ConfigError, match="PET_MASTER_ADDR, PET_MASTER_PORT, PET_NNODES and PET_NODE_RANK"
    ):
        detect_pod_job(
            {"JOB_COMPLETION_INDEX": "1", "PET_NNODES": "2"}, hostname="mypod", fqdn="mypod"
        )


def test_a_jobset_of_several_jobs_needs_the_node_rank_given() -> None:
    with pytest.raises(ConfigError, match="one Job of N pods"):
        detect_pod_job(JOBSET, hostname="wine-node-1-1", fqdn="wine-node-1-1.wine")
    given = {**JOBSET, "PET_NODE_RANK": "3", "PET_MASTER_ADDR": "10.0.0.1"}  # as it says
    assert detect_pod_job(given, hostname="wine-node-1-1", fqdn="wine-node-1-1.wine") is None


def test_python_train_py_in_a_pod_is_one_process_per_pod() -> None:
    world = World.detect(TRAINJOB)
    assert (world.rank, world.world_size, world.local_rank, world.node_rank) == (1, 2, 0, 1)
    assert world.master_addr == "wine-node-0-0.wine" and world.launcher == "trainjob"
    assert "ranks from the Kubeflow TrainJob (one process per pod)" in world.describe()
    # a PyTorchJob's RANK is the pod's: read as such, not as a local rank on one node
    topology = detect_topology(PYTORCHJOB)
    assert (topology.rank, topology.local_rank, topology.local_world_size) == (1, 0, 1)


def test_a_worker_of_ddpkit_run_in_a_pod_keeps_the_ranks_the_launcher_gave() -> None:
    launched = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    worker = {**PYTORCHJOB, **launched, "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "wine"}
    topology = detect_topology(worker)
    assert (topology.rank, topology.local_rank, topology.launcher) == (5, 1, "torchrun")


def test_an_elastic_or_unsized_job_started_with_python_is_told_to_use_ddpkit_run() -> None:
    with pytest.raises(ConfigError, match=r"ddpkit run train\.py"):
        World.detect({**TRAINJOB, "PET_NNODES": "2:4"})
    with pytest.raises(ConfigError, match="Set PET_NNODES"):
        detect_topology({"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "wine-node-0-1"})
    # pod 0 of a job that does not say its size trains as a world of one
    assert (
        detect_topology({"JOB_COMPLETION_INDEX": "0", "HOSTNAME": "wine-node-0-0"}).world_size == 1
    )
