"""What a Kubernetes training controller tells its pods, read as one frozen value.

Each controller publishes the job through its own variables (read from the controllers'
sources; docs/kubernetes.md lists versions):

- Kubeflow Trainer v2 ``TrainJob`` (torch runtime): ``PET_NNODES``, ``PET_NPROC_PER_NODE``,
  ``PET_NODE_RANK`` (the pod's completion index), ``PET_MASTER_ADDR`` =
  ``<job>-node-0-0.<job>``, ``PET_MASTER_PORT`` = 29500. No elastic mode: ``PET_NNODES=MIN:MAX``
  set by hand (kubeflow/trainer#3559) makes ddpkit run torch's c10d rendezvous there.
- Training Operator v1 ``PyTorchJob``: ``MASTER_ADDR`` = ``<job>-master-0``, ``MASTER_PORT``,
  ``RANK`` (the pod's), ``WORLD_SIZE``, and ``PET_NNODES`` / ``PET_NODE_RANK`` /
  ``PET_MASTER_*``; with an elastic policy ``PET_RDZV_ENDPOINT`` and ``PET_NNODES=MIN:MAX``.
- ``JobSet``: no variables of its own; the indexed Job's ``JOB_COMPLETION_INDEX`` and the
  pod's host name ``<jobset>-<replicatedjob>-<jobindex>-<podindex>`` in the JobSet's
  subdomain. The number of pods comes from ``PET_NNODES`` or ``--nnodes``.
- Volcano (TorchX's Kubernetes scheduler): ``VC_<TASK>_HOSTS`` per task; TorchX makes one
  task ``<role>-<i>`` per node, plain Volcano one task of N pods with ``VC_TASK_INDEX``.

Example:
    >>> env = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "4",
    ...        "PET_MASTER_ADDR": "mnist-node-0-0.mnist", "PET_MASTER_PORT": "29500"}
    >>> job = detect_pod_job(env)
    >>> job.controller.label, job.name, job.node_rank, job.master
    ('Kubeflow TrainJob', 'mnist', 1, 'mnist-node-0-0.mnist:29500')
"""

from __future__ import annotations

import enum
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddpkit._core.envvars import int_var
from ddpkit._core.protocol import DEFAULT_MASTER_PORT
from ddpkit.errors import ConfigError

TORCHX_PORT = DEFAULT_MASTER_PORT  # TorchX's dist.ddp rendezvous port (its rdzv_port default)
_TRAINJOB_MASTER = re.compile(r"^(?P<job>[a-z0-9.-]+)-node-0-0\.(?P=job)$")
_PYTORCHJOB_HOST = re.compile(r"^(?P<job>[a-z0-9.-]+)-(master|worker)-\d+$")
_JOBSET_HOST = re.compile(r"^(?P<job>[a-z0-9.-]+)-(?P<jobindex>\d+)-(?P<podindex>\d+)$")
_VOLCANO_TASK = re.compile(r"^VC_(?P<task>[A-Z0-9_]+)_HOSTS$")
_TORCHX_TASK = re.compile(r"^(?P<role>[A-Z0-9_]+)_(?P<replica>\d+)$")


class Controller(str, enum.Enum):
    """The Kubernetes controller whose contract a pod's environment follows.

    Example:
        >>> Controller.JOBSET.label
        'JobSet'
    """

    TRAINJOB = "trainjob"
    PYTORCHJOB = "pytorchjob"
    JOBSET = "jobset"
    VOLCANO = "volcano"
    TORCHX = "torchx"

    @property
    def label(self) -> str:
        """The controller's name as its users know it."""
        return {
            "trainjob": "Kubeflow TrainJob",
            "pytorchjob": "Kubeflow PyTorchJob",
            "jobset": "JobSet",
            "volcano": "Volcano job",
            "torchx": "TorchX job (Volcano)",
        }[self.value]


@dataclass(frozen=True)
class PodJob:
    """One pod's place in a Kubernetes training job, as its controller said it.

    ``nnodes`` is torchrun's ``N`` or ``MIN:MAX`` (None: the controller does not say);
    ``node_rank`` is None for an elastic job (torch's rendezvous assigns it); ``nproc`` is
    ``PET_NPROC_PER_NODE`` as given (``"4"``, ``"auto"``) or None; ``read`` names the
    variables the values came from, for the start-up line.

    Example:
        >>> PodJob(Controller.JOBSET, "train", "2", 1, None, "train-node-0-0.train", 29500,
        ...        ("JOB_COMPLETION_INDEX",)).describe()
        'JobSet train: node 1 of 2 (JOB_COMPLETION_INDEX), master train-node-0-0.train:29500'
    """

    controller: Controller
    name: str
    nnodes: str | None
    node_rank: int | None
    nproc: str | None
    master_addr: str
    master_port: int
    read: tuple[str, ...] = ()

    @property
    def master(self) -> str:
        """``ADDR:PORT`` of node 0, where the job's store listens."""
        return f"{self.master_addr}:{self.master_port}"

    @property
    def elastic(self) -> bool:
        """True when the node count is a range (``MIN:MAX``)."""
        return self.nnodes is not None and ":" in self.nnodes

    def describe(self) -> str:
        """One clause for the start-up line: which controller, where this pod is, from what."""
        of = f" of {self.nnodes}" if self.nnodes else ""
        where = f"node {self.node_rank}{of}"
        if self.node_rank is None:  # elastic: torch's rendezvous assigns it
            where = f"elastic ({self.nnodes} nodes)"
        read = f" ({', '.join(self.read)})" if self.read else ""
        return f"{self.controller.label} {self.name}: {where}{read}, master {self.master}"


def detect_pod_job(
    env: Mapping[str, str], hostname: str | None = None, fqdn: str | None = None
) -> PodJob | None:
    """The controller contract in ``env``, or None outside a pod of a known controller.

    ``hostname`` and ``fqdn`` default to this pod's (``HOSTNAME``, then the resolver).

    Example:
        >>> detect_pod_job({}) is None
        True
    """
    for detector in (_pytorchjob, _trainjob):
        job = detector(env)
        if job is not None:
            return job
    host = hostname or env.get("HOSTNAME") or socket.gethostname()
    if "JOB_COMPLETION_INDEX" in env:
        return _jobset(env, host.split(".")[0], fqdn)
    if any(_VOLCANO_TASK.match(name) for name in env):
        return _volcano(env, host.split(".")[0])
    return None


def _pytorchjob(env: Mapping[str, str]) -> PodJob | None:
    endpoint = env.get("PET_RDZV_ENDPOINT")
    master = env.get("MASTER_ADDR") or endpoint or ""
    found = _PYTORCHJOB_HOST.match(master.rsplit(":", 1)[0] if endpoint else master)
    if found is None or not ("PET_NNODES" in env or "WORLD_SIZE" in env):
        return None
    if endpoint:  # an elastic policy: torch's c10d rendezvous at the first worker
        host, _, port = endpoint.rpartition(":")
        read = ("PET_NNODES", "PET_RDZV_ENDPOINT")
        return PodJob(
            Controller.PYTORCHJOB,
            env.get("PET_RDZV_ID") or found["job"],
            env.get("PET_NNODES"),
            None,
            env.get("PET_NPROC_PER_NODE"),
            host,
            _port(port, "PET_RDZV_ENDPOINT"),
            read,
        )
    nnodes = env.get("PET_NNODES") or env.get("WORLD_SIZE")
    rank_var = "PET_NODE_RANK" if "PET_NODE_RANK" in env else "RANK"
    return PodJob(
        Controller.PYTORCHJOB,
        found["job"],
        nnodes,
        int_var(env, rank_var),
        env.get("PET_NPROC_PER_NODE"),
        master,
        int_var(env, "MASTER_PORT"),
        ("PET_NNODES" if "PET_NNODES" in env else "WORLD_SIZE", rank_var),
    )


def _trainjob(env: Mapping[str, str]) -> PodJob | None:
    found = _TRAINJOB_MASTER.match(env.get("PET_MASTER_ADDR", ""))
    if found is None or "PET_NNODES" not in env or "MASTER_ADDR" in env:
        return None
    elastic = ":" in env["PET_NNODES"]
    node_rank = None if elastic else int_var(env, "PET_NODE_RANK")
    return PodJob(
        Controller.TRAINJOB,
        found["job"],
        env["PET_NNODES"],
        node_rank,
        env.get("PET_NPROC_PER_NODE"),
        env["PET_MASTER_ADDR"],
        int_var(env, "PET_MASTER_PORT", default=DEFAULT_MASTER_PORT),
        ("PET_NNODES",) if elastic else ("PET_NNODES", "PET_NODE_RANK"),
    )


def _jobset(env: Mapping[str, str], host: str, fqdn: str | None) -> PodJob | None:
    """A JobSet pod (or any indexed Job's): node 0 is job 0's pod 0 in the same subdomain."""
    if "PET_NODE_RANK" in env and "PET_MASTER_ADDR" in env:
        return None  # the pod spec gives torchrun's variables itself: torch's parser reads them
    index = int_var(env, "JOB_COMPLETION_INDEX")
    found = _JOBSET_HOST.match(host)
    if found is None or int(found["podindex"]) != index:
        if int(env.get("PET_NNODES", "1").split(":")[-1]) == 1:
            return None  # an indexed Job of one pod per index: nothing to meet
        raise ConfigError(
            f"JOB_COMPLETION_INDEX={index} but the host name {host!r} is not a JobSet pod's "
            "(<jobset>-<job>-<jobindex>-<index>): node 0's name cannot be derived. Set "
            "PET_MASTER_ADDR, PET_MASTER_PORT, PET_NNODES and PET_NODE_RANK in the pod spec."
        )
    if found["jobindex"] != "0":
        raise ConfigError(
            f"pod {host} is in Job {found['jobindex']} of its replicated job: with several "
            "Jobs the node rank needs the Jobs' size. Use one Job of N pods (replicas: 1, "
            "parallelism: N; `ddpkit k8s` writes that), or set PET_NODE_RANK and "
            "PET_MASTER_ADDR yourself."
        )
    subdomain = _subdomain(host, fqdn)
    master = f"{found['job']}-0-0" + (f".{subdomain}" if subdomain else "")
    nnodes = env.get("PET_NNODES")
    port = int_var(
        env, "PET_MASTER_PORT", default=int_var(env, "MASTER_PORT", default=DEFAULT_MASTER_PORT)
    )
    read = ("JOB_COMPLETION_INDEX", "HOSTNAME") + (("PET_NNODES",) if nnodes else ())
    rank = None if nnodes and ":" in nnodes else index
    name = subdomain or found["job"].rsplit("-", 1)[0]  # the subdomain is the JobSet's name
    return PodJob(
        Controller.JOBSET, name, nnodes, rank, env.get("PET_NPROC_PER_NODE"), master, port, read
    )


def _subdomain(host: str, fqdn: str | None) -> str | None:
    """The pod's subdomain (the JobSet's headless service), from its fully qualified name."""
    full = fqdn if fqdn is not None else socket.getfqdn(host)
    head, _, rest = full.partition(".")
    return rest.split(".")[0] if head == host and rest else None


def _volcano(env: Mapping[str, str], host: str) -> PodJob | None:
    tasks = {m["task"]: env[m.string].split(",") for m in map(_VOLCANO_TASK.match, env) if m}
    mine = next((t for t, hosts in tasks.items() if host in _short(hosts)), None)
    if mine is None:
        return None  # a pod of another task (a parameter server): not a training node
    replica = _TORCHX_TASK.match(mine)
    if replica and ("TORCHX_JOB_ID" in env or "TORCHX_RANK0_HOST" in env):
        role = replica["role"]
        nodes = sorted(
            int(m["replica"]) for t in tasks if (m := _TORCHX_TASK.match(t)) and m["role"] == role
        )
        master = tasks.get(f"{role}_0", [""])[0]
        app = re.split(r"[:/]", env.get("TORCHX_JOB_ID", role.lower()))[-1]
        return PodJob(
            Controller.TORCHX,
            app,
            str(len(nodes)),
            int(replica["replica"]),
            None,
            master,
            TORCHX_PORT,
            (f"VC_{role}_*_HOSTS",),
        )
    hosts = tasks[mine]
    rank = int_var(env, "VC_TASK_INDEX", default=_short(hosts).index(host))
    name = host.rsplit("-", 2)[0] if host.count("-") >= 2 else host
    port = int_var(env, "MASTER_PORT", default=TORCHX_PORT)
    return PodJob(
        Controller.VOLCANO,
        name,
        str(len(hosts)),
        rank,
        None,
        hosts[0],
        port,
        (f"VC_{mine}_HOSTS", "VC_TASK_INDEX"),
    )


def _short(hosts: list[str]) -> list[str]:
    return [h.split(".")[0] for h in hosts]


def _port(text: str, variable: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ConfigError(f"{variable} has no TCP port (1..65535) after its ':' (got {text!r})")
    return int(text)


def pod_topology_fields(job: PodJob) -> dict[str, Any]:
    """The ranks of a process started directly in the pod (``python train.py``): one per pod.

    Example:
        >>> job = PodJob(Controller.TRAINJOB, "m", "2", 1, "1", "m-node-0-0.m", 29500)
        >>> pod_topology_fields(job)["rank"]
        1
    """
    if job.elastic or job.node_rank is None:
        raise ConfigError(
            f"{job.controller.label} {job.name} is elastic (nodes {job.nnodes}): node ranks "
            "are assigned by torch's rendezvous, which `ddpkit run` runs. Make the container's "
            "command `ddpkit run train.py` instead of `python train.py`."
        )
    if job.nnodes is None:
        raise ConfigError(
            f"{job.controller.label} {job.name}: pod {job.node_rank}, but nothing says how many "
            "pods the job has. Set PET_NNODES in the pod spec (`ddpkit k8s` does) or start "
            "with `ddpkit run --nnodes N train.py`."
        )
    return {
        "rank": job.node_rank,
        "local_rank": 0,
        "world_size": int(job.nnodes),
        "local_world_size": 1,
        "node_rank": job.node_rank,
        "master_addr": job.master_addr,
        "master_port": job.master_port,
        "launcher": job.controller.value,
    }
