"""``ddpkit k8s``: every manifest it writes validates against the controllers' stored CRD
schemas (tests/data/k8s/SOURCES.md), and carries the pod settings and failure policy."""

from __future__ import annotations

import json

import pytest
import yaml

from ddpkit.cli import main
from ddpkit.errors import ConfigError
from ddpkit.tools.k8s.manifests import EXIT_CODES, K8sOptions, manifests
from helpers.crds import errors

SHAPES = [
    {},
    {"nodes": 4, "gpus_per_node": 8, "cpu": "32", "memory": "256Gi"},
    {
        "nodes": 2,
        "nproc_per_node": 4,
        "checkpoint_pvc": "ckpt",
        "checkpoint_mount": "/ckpt",
        "queue": "team-a",
        "namespace": "ml",
        "grace_period": 300,
        "max_restarts": 0,
        "shm": "8Gi",
    },
]


@pytest.mark.parametrize("kind", ["trainjob", "jobset"])
@pytest.mark.parametrize("shape", SHAPES, ids=["defaults", "gpus", "everything"])
def test_every_manifest_validates_against_the_controllers_crd(kind: str, shape: dict) -> None:
    options = K8sOptions(name="wine", image="registry.example/wine:1", kind=kind, **shape)
    documents = manifests(
        options, "examples/wine.py", ["--epochs", "5", "--checkpoint-dir", "/ckpt/w"]
    )
    assert documents
    for document in documents:
        assert errors(document) == [], document["kind"]


def test_the_validator_refuses_what_the_api_server_would() -> None:
    jobset = manifests(K8sOptions(name="wine", image="i", kind="jobset"), "t.py", [])[0]
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["terminationGracePeriodSecond"] = 30  # a typo: an unknown field
    pod["containers"][0]["ports"][0]["containerPort"] = "29500"  # a string for an integer
    del jobset["spec"]["replicatedJobs"][0]["name"]  # a required field
    found = "\n".join(errors(jobset))
    assert "terminationGracePeriodSecond" in found
    assert "'29500' is not of type 'integer'" in found
    assert "'name' is a required property" in found


def test_trainjob_runs_ddpkit_run_with_the_runtime_that_carries_the_pod_settings() -> None:
    options = K8sOptions(name="wine", image="i", nodes=2, gpus_per_node=4, checkpoint_pvc="ckpt")
    runtime, trainjob = manifests(options, "train.py", ["--lr", "0.1"])
    assert trainjob["spec"]["runtimeRef"] == {
        "name": "wine-runtime",
        "kind": "TrainingRuntime",
        "apiGroup": "trainer.kubeflow.org",
    }
    trainer = trainjob["spec"]["trainer"]
    assert trainer["command"] + trainer["args"] == ["ddpkit", "run", "train.py", "--lr", "0.1"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 4)
    assert trainer["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": 4}
    job = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    pod = job["template"]["spec"]["template"]["spec"]
    assert job["name"] == pod["containers"][0]["name"] == "node"  # where Trainer puts PET_*
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in pod["volumes"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}} in pod["volumes"]
    assert pod["terminationGracePeriodSeconds"] == 120 and pod["restartPolicy"] == "Never"


def test_jobset_pods_find_each_other_by_host_name_and_index() -> None:
    options = K8sOptions(
        name="wine", image="i", kind="jobset", nodes=3, nproc_per_node=2, grace_period=45
    )  # not the defaults: a variable that ignored its option would still match those
    jobset = manifests(options, "t.py", [])[0]
    assert jobset["spec"]["network"] == {
        "enableDNSHostnames": True,
        "publishNotReadyAddresses": True,
    }
    job = jobset["spec"]["replicatedJobs"][0]
    assert job["replicas"] == 1  # one Job of N pods: node rank = completion index
    spec = job["template"]["spec"]
    assert (spec["parallelism"], spec["completions"], spec["completionMode"]) == (3, 3, "Indexed")
    (container,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    # Every variable the pods read, and no other (tests/helpers/pods.py gives pods these).
    assert env == {
        "PET_NNODES": "3",
        "PET_NPROC_PER_NODE": "2",
        "PET_MASTER_PORT": "29500",
        "DDPKIT_GRACE_PERIOD": "45",
    }
    assert container["ports"] == [{"containerPort": 29500, "name": "c10d"}]


def test_the_failure_policy_follows_ddpkits_exit_codes() -> None:
    jobset = manifests(
        K8sOptions(name="wine", image="i", kind="jobset", max_restarts=5), "t.py", []
    )[0]
    rules = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["onExitCodes"]["values"] == [75]  # preempted after a checkpoint
    assert rules[1]["onPodConditions"][0]["type"] == "DisruptionTarget"  # evicted, drained
    assert rules[2]["onExitCodes"]["values"] == [1, 2]  # a bad script, a bad setting
    policy = jobset["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 5
    retry, fatal = policy["rules"]
    assert retry["action"] == "RestartJobSetAndIgnoreMaxRestarts"
    assert retry["onJobFailureMessagePatterns"] == ["matching FailJob rule at index [01]"]
    assert fatal["action"] == "FailJobSet"
    assert {1, 2, 69, 75, 124, 137} <= set(EXIT_CODES)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"name": "Wine_1"}, "--name"),
        ({"nodes": 0}, "--nodes"),
        ({"kind": "pytorchjob"}, "--kind"),
        ({"grace_period": 0}, "--grace-period"),
        ({"name": "x" * 41}, "--name"),
    ],
)
def test_bad_options_are_refused_by_name(change: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        manifests(K8sOptions(**{"name": "wine", "image": "i", **change}), "t.py", [])


def test_the_command_prints_yaml_that_kubectl_reads_and_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(["k8s", "--image", "i", "--nodes", "2", "--kind", "jobset", "t.py", "--lr", "1"]) == 0
    )
    (jobset,) = list(yaml.safe_load_all(capsys.readouterr().out))
    assert errors(jobset) == []
    assert main(["k8s", "--image", "i", "--format", "json", "t.py"]) == 0
    assert [d["kind"] for d in json.loads(capsys.readouterr().out)] == [
        "TrainingRuntime",
        "TrainJob",
    ]
    assert main(["k8s", "--image", "i", "--name", "Bad_Name", "t.py"]) == 2
