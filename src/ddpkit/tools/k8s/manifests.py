"""Kubernetes manifests for a ddpkit job: a Kubeflow TrainJob (with its TrainingRuntime) or a
JobSet, each running ``ddpkit run SCRIPT ...`` in every pod.

What each manifest carries beyond the script, and why:

- a memory-backed ``/dev/shm`` (containers get 64 MiB; NCCL and loader workers need more);
- ``terminationGracePeriodSeconds`` long enough for one checkpoint (SIGKILL follows SIGTERM
  after it), also given to the pods as ``DDPKIT_GRACE_PERIOD`` for ``ddpkit doctor``;
- a checkpoint volume (a ReadWriteMany PVC) every pod sees, or none for ``s3://``;
- the failure policy of :data:`EXIT_CODES`: a preempted pod (exit 75, or evicted) restarts
  the job without counting, a bad script or setting (1, 2) fails it at once, anything else
  (a lost peer 69, a hang 124, a kill 137) restarts it up to ``max_restarts`` times;
- an optional Kueue queue (the ``kueue.x-k8s.io/queue-name`` label).

Example:
    >>> options = K8sOptions(name="wine", image="registry/wine:1", nodes=2)
    >>> [m["kind"] for m in manifests(options, "train.py", [])]
    ['TrainingRuntime', 'TrainJob']
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ddpkit._core.protocol import (
    CONFIG_EXIT_CODE,
    DEFAULT_MASTER_PORT,
    GRACE_PERIOD_ENV,
    PREEMPTED_EXIT_CODE,
)
from ddpkit.errors import ConfigError

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
KUEUE_LABEL = "kueue.x-k8s.io/queue-name"
NODE = "node"  # the replicated job's and the container's name (Trainer's torch runtime's too)
PORT = DEFAULT_MASTER_PORT
SCRIPT_ERROR_EXIT_CODE = 1  # Python's, for an exception the script did not catch
# exit code -> what it means and what the failure policy does (docs/kubernetes.md)
EXIT_CODES = {
    0: "finished",
    1: "the script raised: fatal, the job fails",
    2: "ddpkit refused a setting: fatal, the job fails",
    69: "a peer was lost or the nodes could not meet: restart, counted",
    75: "preempted after a checkpoint: restart, not counted",
    124: "a hang was reported: restart, counted",
    137: "killed (OOM, or SIGKILL after the grace period): restart, counted",
}
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_MAX_NAME = 40  # the longest pod name, <name>-node-0-<N> plus the Job's suffix, stays <= 63


@dataclass(frozen=True)
class K8sOptions:
    """What the job asks Kubernetes for.

    Example:
        >>> K8sOptions(name="wine", image="i", gpus_per_node=4).workers_per_node
        4
    """

    name: str
    image: str
    kind: str = "trainjob"  # or "jobset"
    nodes: int = 1
    nproc_per_node: int | None = None
    gpus_per_node: int = 0
    cpu: str | None = None
    memory: str | None = None
    shm: str | None = None  # default: 512 MiB per worker, rounded up to GiB
    grace_period: int = 120
    checkpoint_pvc: str | None = None
    checkpoint_mount: str = "/checkpoints"
    queue: str | None = None
    max_restarts: int = 3
    namespace: str | None = None

    @property
    def workers_per_node(self) -> int:
        """Worker processes per pod: the flag, else one per GPU, else 1."""
        return self.nproc_per_node or self.gpus_per_node or 1

    @property
    def shm_size(self) -> str:
        """The ``/dev/shm`` volume's size limit, a Kubernetes quantity."""
        return self.shm or f"{-(-self.workers_per_node // 2)}Gi"


def manifests(options: K8sOptions, script: str, script_args: list[str]) -> list[dict[str, Any]]:
    """The documents to ``kubectl apply``: a TrainingRuntime and a TrainJob, or a JobSet.

    Example:
        >>> jobset = manifests(K8sOptions("wine", "i", kind="jobset"), "t.py", [])[0]
        >>> jobset["spec"]["network"]["enableDNSHostnames"]
        True
    """
    check(options)
    args = [script, *script_args]
    if options.kind == "jobset":
        return [_jobset(options, args)]
    return [_training_runtime(options), _trainjob(options, args)]


def check(options: K8sOptions) -> None:
    """Refuse what Kubernetes would refuse, naming the value.

    Example:
        >>> check(K8sOptions(name="Wine_1", image="i"))
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: --name 'Wine_1' is not a DNS label (lower case letters, ...
    """
    if not _NAME.match(options.name) or len(options.name) > _MAX_NAME:
        raise ConfigError(
            f"--name {options.name!r} is not a DNS label (lower case letters, digits and '-', "
            f"starting with a letter, at most {_MAX_NAME} characters): pods are named after it"
        )
    if options.kind not in ("trainjob", "jobset"):
        raise ConfigError(f"--kind {options.kind!r}: choose trainjob or jobset")
    numbers = {
        "--nodes": options.nodes,
        "--grace-period": options.grace_period,
        "--max-restarts": options.max_restarts + 1,
        "--gpus-per-node": options.gpus_per_node + 1,
        "--nproc-per-node": options.nproc_per_node or 1,
    }
    for flag, value in numbers.items():
        if value < 1:
            raise ConfigError(f"{flag} must be at least {1 if flag != '--max-restarts' else 0}")
    if not options.image:
        raise ConfigError("--image is needed: a container image with your script and ddpkit")


def _metadata(options: K8sOptions, name: str, queue: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if options.namespace:
        metadata["namespace"] = options.namespace
    if queue and options.queue:
        metadata["labels"] = {KUEUE_LABEL: options.queue}
    return metadata


def _trainjob(options: K8sOptions, args: list[str]) -> dict[str, Any]:
    """The TrainJob: what runs; where and how is its TrainingRuntime's."""
    trainer: dict[str, Any] = {
        "image": options.image,
        "command": ["ddpkit", "run"],
        "args": args,
        "numNodes": options.nodes,
        "numProcPerNode": options.workers_per_node,
    }
    resources = _resources(options)
    if resources:
        trainer["resourcesPerNode"] = resources
    return {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": _metadata(options, options.name, queue=True),
        "spec": {
            "runtimeRef": {
                "name": _runtime_name(options),
                "kind": "TrainingRuntime",
                "apiGroup": TRAINER_API.split("/")[0],
            },
            "trainer": trainer,
        },
    }


def _training_runtime(options: K8sOptions) -> dict[str, Any]:
    """Trainer's torch runtime (PET_* injected into the ``node`` container) with ddpkit's
    pod settings and failure policy, which a TrainJob itself cannot set."""
    pod = _pod_spec(options, container={"name": NODE, "image": options.image})
    job = _job_spec(pod)
    replicated = {
        "name": NODE,
        "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": job,
        },
    }
    return {
        "apiVersion": TRAINER_API,
        "kind": "TrainingRuntime",
        "metadata": {
            **_metadata(options, _runtime_name(options)),
            "labels": {"trainer.kubeflow.org/framework": "torch"},
        },
        "spec": {
            "mlPolicy": {"numNodes": options.nodes, "torch": {}},
            "template": {
                "spec": {
                    "failurePolicy": _jobset_failure_policy(options),
                    "replicatedJobs": [replicated],
                }
            },
        },
    }


def _jobset(options: K8sOptions, args: list[str]) -> dict[str, Any]:
    """A JobSet of one indexed Job of ``nodes`` pods: ``ddpkit run`` finds node 0 from the
    pod's host name and its index from JOB_COMPLETION_INDEX; PET_NNODES says how many."""
    env = [
        {"name": "PET_NNODES", "value": str(options.nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(options.workers_per_node)},
        {"name": "PET_MASTER_PORT", "value": str(PORT)},
    ]
    container: dict[str, Any] = {
        "name": NODE,
        "image": options.image,
        "command": ["ddpkit", "run"],
        "args": args,
        "env": env,
        "ports": [{"containerPort": PORT, "name": "c10d"}],
    }
    resources = _resources(options)
    if resources:
        container["resources"] = resources
    job = {
        "parallelism": options.nodes,
        "completions": options.nodes,
        "completionMode": "Indexed",
        **_job_spec(_pod_spec(options, container)),
    }
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": _metadata(options, options.name, queue=True),
        "spec": {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "failurePolicy": _jobset_failure_policy(options),
            "replicatedJobs": [{"name": NODE, "replicas": 1, "template": {"spec": job}}],
        },
    }


def _pod_spec(options: K8sOptions, container: dict[str, Any]) -> dict[str, Any]:
    env = container.setdefault("env", [])
    env.append({"name": GRACE_PERIOD_ENV, "value": str(options.grace_period)})
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": options.shm_size}}
    ]
    if options.checkpoint_pvc:
        mounts.append({"name": "checkpoints", "mountPath": options.checkpoint_mount})
        volumes.append(
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": options.checkpoint_pvc}}
        )
    container["volumeMounts"] = mounts
    return {
        "restartPolicy": "Never",  # podFailurePolicy needs it; the JobSet restarts the group
        "terminationGracePeriodSeconds": options.grace_period,
        "containers": [container],
        "volumes": volumes,
    }


def _job_spec(pod: dict[str, Any]) -> dict[str, Any]:
    """A Job that fails on its first counted pod failure, so its JobSet restarts every pod
    together (a gang: one pod cannot rejoin the others' process group)."""
    return {"backoffLimit": 0, "podFailurePolicy": _pod_failure_policy(), "template": {"spec": pod}}


def _pod_failure_policy() -> dict[str, Any]:
    """Rules 0 and 1 are retriable stops, rule 2 the fatal codes: the JobSet's rules tell
    them apart by the index the Job's failure message names."""
    return {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": NODE,
                    "operator": "In",
                    "values": [PREEMPTED_EXIT_CODE],
                },
            },
            {
                "action": "FailJob",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": NODE,
                    "operator": "In",
                    "values": [SCRIPT_ERROR_EXIT_CODE, CONFIG_EXIT_CODE],
                },
            },
        ]
    }


def _jobset_failure_policy(options: K8sOptions) -> dict[str, Any]:
    return {
        "maxRestarts": options.max_restarts,
        "rules": [
            {
                "name": "preempted",
                "action": "RestartJobSetAndIgnoreMaxRestarts",
                "onJobFailureReasons": ["PodFailurePolicy"],
                "onJobFailureMessagePatterns": ["matching FailJob rule at index [01]"],
            },
            {"name": "fatal", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
        ],
    }


def _resources(options: K8sOptions) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if options.gpus_per_node:
        limits["nvidia.com/gpu"] = options.gpus_per_node
    if options.cpu:
        limits["cpu"] = options.cpu
    if options.memory:
        limits["memory"] = options.memory
    return {"limits": limits, "requests": dict(limits)} if limits else {}


def _runtime_name(options: K8sOptions) -> str:
    return f"{options.name}-runtime"
