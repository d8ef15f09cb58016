"""Pods of a Kubernetes training job, without Kubernetes: one virtual host per pod.

Each pod is a network namespace (:mod:`helpers.netns`) whose host name is the pod's
(``wine-node-0-1``), whose hosts file holds the job's headless service as cluster DNS
answers it (``ADDR wine-node-0-1.wine.default.svc.cluster.local wine-node-0-1.wine
wine-node-0-1``, the fully qualified name first, as a reverse lookup gives it), and whose
process gets exactly the variables its pod spec (as ``ddpkit k8s`` writes it) and the
controller give it, on a copy of this environment without any launcher's or ddpkit's
variables. What Kubernetes does around the pods is here too: a name published late
(:meth:`PodJob.hide`, :meth:`PodJob.publish`), pods deleted (SIGTERM to the container's
first process, SIGKILL to everything left after the grace period: :meth:`PodJob.delete`)
and recreated elsewhere, with a new address under the same name (:meth:`PodJob.recreate`).

The namespaces share this machine's file systems: a folder made by the test is what a
ReadWriteMany volume is to real pods. Skipped with the reason where namespaces cannot be
made (see :func:`helpers.netns.virtual_hosts`).

Example::

    with pod_job("trainjob", "wine", 2) as job:
        command = ["run", "examples/wine.py", "--epochs", "5"]  # `ddpkit run`, no node flags
        pods = [job.start(i, command, tmp_path) for i in (0, 1)]
        assert [pod.wait(120) for pod in pods] == [0, 0]
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpkit.cli import main as ddpkit_main
from helpers.launch_helpers import REPO
from helpers.netns import VirtualHost, add_host, remove_host, virtual_hosts

DOMAIN = "default.svc.cluster.local"  # the pods' namespace "default", the cluster's domain
PORT = 29500  # Trainer's torch runtime's PET_MASTER_PORT (the JobSet's is the manifest's)
KINDS = ("trainjob", "jobset")
REPLICATED_JOB = "node"  # Trainer's torch runtime and `ddpkit k8s --kind jobset` call it so
# Variables a pod never inherits from the test's own environment: launchers', schedulers',
# ddpkit's (the tests set the ones they mean), and the network interface (eth0 in a pod).
_NOT_INHERITED = ("PET_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "VC_", "TORCHX_",
                  "KUBEFLOW_TRAINER_", "DDPKIT_", "NCCL_", "GLOO_", "TP_SOCKET_")  # fmt: skip
_LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "MASTER_ADDR", "MASTER_PORT", "JOB_COMPLETION_INDEX", "HOSTNAME")  # fmt: skip


@dataclass
class Pod:
    """One pod: its index in the job, its name, the host it runs on now."""

    index: int
    name: str
    host: VirtualHost
    hidden: set[str] = field(default_factory=set)  # pod names its hosts file lacks for now
    deleted: bool = False


class PodProcess:
    """A pod's container: its command in the background, in a session of its own, its
    stdout and stderr in files."""

    def __init__(self, pod: Pod, command: list[str], env: Mapping[str, str], folder: Path) -> None:
        self.pod = pod
        folder.mkdir(parents=True, exist_ok=True)
        self.out, self.err = folder / f"{pod.name}.out", folder / f"{pod.name}.err"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.process = subprocess.Popen(command, cwd=REPO, env=dict(env), stdout=out,
                                            stderr=err, start_new_session=True)  # fmt: skip

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self, timeout: float) -> int:
        """Its exit code; on a timeout everything in the pod is killed and the test fails."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_everything_in(self.pod.host)
            self.process.wait(timeout=30)
            raise AssertionError(
                f"pod {self.pod.name} still ran after {timeout} s; its output:\n{self.output}"
            ) from None

    @property
    def stdout(self) -> str:
        return self.out.read_text()

    @property
    def stderr(self) -> str:
        return self.err.read_text()

    @property
    def output(self) -> str:
        """stdout then stderr, as ``kubectl logs`` shows them (less their interleaving)."""
        return self.stdout + self.stderr


class PodJob:
    """The pods of a TrainJob or JobSet named ``name`` (also its subdomain: the headless
    service a JobSet and Trainer make for it) on one virtual network."""

    def __init__(self, kind: str, name: str, hosts: list[VirtualHost], nproc: int,
                 grace_s: int, cores: int) -> None:  # fmt: skip
        assert kind in KINDS, kind
        self.kind, self.name, self.nproc, self.grace_s = kind, name, nproc, grace_s
        self.cores = cores
        self.spec_env = manifest_env(kind, name, len(hosts), nproc, grace_s)
        self.pods = [Pod(i, host.name, host) for i, host in enumerate(hosts)]
        self.added: list[VirtualHost] = []  # hosts of recreated pods: this helper removes them
        self.processes: list[PodProcess] = []
        self._numbers = iter(range(len(hosts) + 2, 255))  # addresses no host had yet
        self._threads: list[threading.Thread] = []  # names published later
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self.write_hosts()

    # -- names ----------------------------------------------------------------------------

    @staticmethod
    def pod_name(job: str, index: int) -> str:
        """``<job>-node-0-<index>``: Trainer's pods, and a JobSet's of replicated job "node"."""
        return f"{job}-{REPLICATED_JOB}-0-{index}"

    @property
    def master(self) -> str:
        """Node 0's name in the headless service, as Trainer's PET_MASTER_ADDR gives it."""
        return f"{self.pods[0].name}.{self.name}"

    def fqdn(self, pod: Pod) -> str:
        return f"{pod.name}.{self.name}.{DOMAIN}"

    # -- what the controller injects -------------------------------------------------------

    def env(self, index: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The pod's environment: this process's, cleaned, with the controller's variables.

        Both kinds: the pod spec's variables as ``ddpkit k8s`` writes them (:func:`manifest_env`:
        the JobSet's PET_NNODES, PET_NPROC_PER_NODE, PET_MASTER_PORT; DDPKIT_GRACE_PERIOD),
        the indexed Job's JOB_COMPLETION_INDEX and the kubelet's HOSTNAME. TrainJob: Trainer
        v2's torch runtime injects PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
        PET_MASTER_ADDR and PET_MASTER_PORT (a JobSet's pods have no master, no node rank).
        """
        pod = self.pods[index]
        clean = {
            name: value
            for name, value in os.environ.items()
            if name not in _LAUNCHER_VARS and not name.startswith(_NOT_INHERITED)
        }
        contract = {**self.spec_env, "JOB_COMPLETION_INDEX": str(index), "HOSTNAME": pod.name}
        if self.kind == "trainjob":
            contract |= self.trainer_env(index)
        return {**clean, "GLOO_SOCKET_IFNAME": pod.host.interface, **contract, **(extra or {})}

    def trainer_env(self, index: int) -> dict[str, str]:
        """What Trainer's controller injects (not in ddpkit's manifests: it is Trainer's)."""
        return {
            "PET_NNODES": str(len(self.pods)),
            "PET_NPROC_PER_NODE": str(self.nproc),
            "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": self.master,
            "PET_MASTER_PORT": str(PORT),
        }

    # -- the headless service (hosts files) -------------------------------------------------

    def hosts_text(self, pod: Pod) -> str:
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        for other in self.pods:
            if other.deleted or other.name in pod.hidden:
                continue
            lines.append(f"{other.host.address} {self.fqdn(other)} {other.name}.{self.name} "
                         f"{other.name}")  # fmt: skip
        return "\n".join(lines) + "\n"

    def write_hosts(self) -> None:
        """Every live pod's hosts file, rewritten in place: a running process has it
        bind-mounted at /etc/hosts, which a new file (a rename) would not reach."""
        with self._lock:
            for pod in self.pods:
                if not pod.deleted:
                    Path(f"/etc/netns/{pod.host.namespace}/hosts").write_text(self.hosts_text(pod))

    def hide(self, name_of: int, from_pod: int) -> None:
        """Leave pod ``name_of``'s names out of pod ``from_pod``'s hosts file: its DNS
        record is not published yet (or the pod's resolver cached the miss)."""
        self.pods[from_pod].hidden.add(self.pods[name_of].name)
        self.write_hosts()

    def publish(
        self, name_of: int, to_pod: int, after_s: float = 0.0,
        once: Callable[[], bool] | None = None,
    ) -> None:  # fmt: skip
        """Add pod ``name_of``'s names to pod ``to_pod``'s hosts file ``after_s`` from now, or
        from when ``once()`` first holds (polled in a thread: a pod seen waiting for it)."""

        def add() -> None:
            while once is not None and not once():
                if self._closed.wait(0.1):
                    return
            if self._closed.wait(after_s):
                return  # the job ended first
            self.pods[to_pod].hidden.discard(self.pods[name_of].name)
            self.write_hosts()

        if after_s <= 0 and once is None:
            add()
            return
        thread = threading.Thread(target=add, daemon=True)
        self._threads.append(thread)
        thread.start()

    # -- pods' lives ------------------------------------------------------------------------

    def start(
        self,
        index: int,
        argv: list[str],
        folder: Path,
        env: Mapping[str, str] | None = None,
        shm: str | None = None,
    ) -> PodProcess:
        """Pod ``index``'s container running ``python -m ddpkit ARGV`` (``run SCRIPT ...``: no
        node flags, the controller's variables must do), output under ``folder``; with
        ``shm`` ("64m"), a tmpfs of that size over its /dev/shm first (a container's default)."""
        pod = self.pods[index]
        assert not pod.deleted, f"pod {pod.name} was deleted: recreate it first"
        argv = ["taskset", "-c", self.cpus(index), sys.executable, "-m", "ddpkit", *argv]
        if shm is not None:  # in the pod's own mount namespace: this machine's stays as it is
            mount = f'mount -t tmpfs -o size={shm} tmpfs /dev/shm && exec "$@"'
            argv = ["sh", "-c", mount, "sh", *argv]
        process = PodProcess(pod, pod.host.command(*argv), self.env(index, env), folder)
        self.processes.append(process)
        return process

    def cpus(self, index: int) -> str:
        """The cores pod ``index`` may run on (taskset's list): ``cores`` of this machine's,
        round the pods in turn, as the kubelet's static CPU manager gives a pod whole cores
        (``ddpkit run`` then splits them between the pod's workers, OMP_NUM_THREADS)."""
        mine = sorted(os.sched_getaffinity(0))
        return ",".join(str(mine[(index * self.cores + k) % len(mine)]) for k in range(self.cores))

    def delete(self, processes: list[PodProcess]) -> list[int]:
        """Delete the pods as the kubelet does: SIGTERM to each container's main process (the
        pod's ``ddpkit run``), then SIGKILL to everything still running in a pod after the
        grace period. The exit codes, in order; the pods are gone (recreate them)."""
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        codes = []
        for process in processes:
            try:
                codes.append(process.process.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                kill_everything_in(process.pod.host)
                codes.append(process.process.wait(timeout=30))
        for process in processes:
            kill_everything_in(process.pod.host)  # its workers, had they outlived it
            process.pod.deleted = True
        return codes

    def recreate(self, index: int) -> Pod:
        """Pod ``index`` anew, as its controller recreates a deleted pod: same name, a new
        network namespace and a new address; every live pod's hosts file says it."""
        old = self.pods[index]
        kill_everything_in(old.host)
        host = add_host(old.host, old.name, next(self._numbers))
        self.added.append(host)
        remove_host(old.host)  # one of virtual_hosts' own is removed again on exit: harmless
        if old.host in self.added:
            self.added.remove(old.host)
        self.pods[index] = Pod(index, old.name, host)
        self.write_hosts()
        return self.pods[index]

    def close(self) -> None:
        """Nothing of the job is left: threads, processes, added hosts."""
        self._closed.set()
        for thread in self._threads:
            thread.join(timeout=10)
        for pod in self.pods:
            kill_everything_in(pod.host)
        for process in self.processes:  # one in no pod any more (never: a safety net)
            if process.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.process.wait(timeout=30)
        for host in self.added:
            remove_host(host)


def pods_running(host: VirtualHost) -> list[int]:
    """The pids of every process in the host's network namespace ([] once it is removed)."""
    found = subprocess.run(["ip", "netns", "pids", host.namespace], capture_output=True,
                           text=True)  # fmt: skip
    return [int(pid) for pid in found.stdout.split()] if found.returncode == 0 else []


def kill_everything_in(host: VirtualHost, timeout: float = 30) -> None:
    """SIGKILL to every process in the host's network namespace, until none is left (a
    container's end: the kubelet kills its whole cgroup)."""
    deadline = time.monotonic() + timeout
    while left := pods_running(host):
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise AssertionError(f"processes {left} of {host.name} survive SIGKILL")
        time.sleep(0.05)


@contextlib.contextmanager
def pod_job(kind: str, name: str, count: int, nproc: int = 1, grace_s: int = 20,
            cores: int = 1) -> Iterator[PodJob]:  # fmt: skip
    """``count`` pods of the ``kind`` job ``name`` (``"trainjob"`` or ``"jobset"``), each
    with ``nproc`` workers on ``cores`` cores of its own (where this machine has enough), a
    ``grace_s`` termination grace period; on exit every process in them is killed and every
    host removed."""
    names = [PodJob.pod_name(name, i) for i in range(count)]
    with virtual_hosts(count, names=names) as hosts:
        job = PodJob(kind, name, hosts, nproc, grace_s, cores)
        try:
            yield job
        finally:
            job.close()


def manifest_env(kind: str, name: str, nodes: int, nproc: int, grace_s: int) -> dict[str, str]:
    """The ``node`` container's variables in what ``ddpkit k8s --kind KIND`` prints for this
    job (a TrainJob's are in its TrainingRuntime): read from the command's own output, so the
    pods get what real pods would, not a copy that could drift from it."""
    argv = ["k8s", "--kind", kind, "--name", name, "--image", "unused", "--nodes", str(nodes),
            "--nproc-per-node", str(nproc), "--grace-period", str(grace_s), "--format", "json",
            "train.py"]  # fmt: skip
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert ddpkit_main(argv) == 0, f"ddpkit {' '.join(argv)} failed"
    (node,) = [c for c in _containers(json.loads(printed.getvalue())) if c["name"] == "node"]
    return {variable["name"]: variable["value"] for variable in node.get("env", [])}


def _containers(tree: Any) -> Iterator[dict[str, Any]]:
    """Every container spec anywhere in the manifests (each kind nests its pods otherwise)."""
    if isinstance(tree, dict):
        yield from tree.get("containers", [])
        tree = list(tree.values())
    if isinstance(tree, list):
        for child in tree:
            yield from _containers(child)
