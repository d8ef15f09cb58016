"""Preflight checks for a container or a Kubernetes pod: shared memory, grace period, and a
checkpoint folder every pod sees.

- ``/dev/shm``: containers get 64 MiB unless a memory-backed volume is mounted there; NCCL's
  shared-memory transport and the DataLoader's worker processes (each batch crosses it) need
  more, and fail with "Bus error" or "unable to write to file </torch_...>" mid-run.
- the termination grace period: SIGKILL follows SIGTERM after it (30 s by default); the
  slowest recent checkpoint save (:mod:`ddpkit.checkpoint.savetimes`) must fit in it.
- the checkpoint folder: on the container's own file system (overlay), a tmpfs or a node's
  local disk, a restarted pod on another node starts over.

Example:
    >>> check_shm(64 * 2**20, workers=2, loader_workers=0).status
    'FAIL'
    >>> check_grace_period(None, None).status
    'SKIP'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ddpkit._core.envvars import seconds_var
from ddpkit._core.protocol import GRACE_PERIOD_ENV
from ddpkit.checkpoint.savetimes import slowest_save
from ddpkit.checkpoint.storage import local_path
from ddpkit.env.kubernetes import PodJob, detect_pod_job
from ddpkit.tools.doctor.preflight import FAIL, PASS, SKIP, WARN, Check, workers_here

MIB = 2**20
SHM_PER_WORKER = 512 * MIB  # NCCL's per-peer buffers and a few loader batches in flight
SHM_PER_LOADER_WORKER = 256 * MIB
SHM_FLOOR = 256 * MIB  # below it, a DataLoader with workers fails on its first batches
_SHARED_TYPES = (
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "ceph",
    "cephfs",
    "lustre",
    "gpfs",
    "beegfs",
    "glusterfs",
    "9p",
    "virtiofs",
    "wekafs",
    "fuse",
)
_SHM_FIX = (
    "mount a memory-backed emptyDir at /dev/shm: volumes: [{name: dshm, emptyDir: {medium: "
    "Memory, sizeLimit: %s}}] and volumeMounts: [{name: dshm, mountPath: /dev/shm}] (`ddpkit "
    "k8s` writes them); docker run --shm-size=%s"
)


def container_checks(
    environ: Mapping[str, str],
    nproc: int | None,
    loader_workers: int,
    grace_s: float | None,
    checkpoint_dir: str | None,
) -> list[Check]:
    """The three checks for this container; workers and pods from a Kubernetes contract,
    the grace period from ``DDPKIT_GRACE_PERIOD`` unless given.

    Example:
        >>> [c.name for c in container_checks({}, None, 0, None, None)]
        ['shared memory', 'grace period', 'checkpoint folder']
    """
    pod = detect_pod_job(environ)
    workers = nproc or _pod_workers(pod) or workers_here(environ, None)[0]
    pods = int((pod.nnodes or "1").split(":")[-1]) if pod is not None else None
    grace = grace_s if grace_s is not None else grace_from(environ)
    return [
        check_shm(shm_bytes(), workers, loader_workers),
        check_grace_period(grace, checkpoint_dir),
        check_checkpoint_shared(checkpoint_dir, pods),
    ]


def _pod_workers(pod: PodJob | None) -> int | None:
    nproc = pod.nproc if pod is not None else None
    return int(nproc) if nproc and nproc.isdigit() else None


def shm_bytes(path: str = "/dev/shm") -> int | None:
    """The size of the shared-memory file system at ``path``, or None where there is none.

    Example:
        >>> shm_bytes("/nonexistent") is None
        True
    """
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def check_shm(size: int | None, workers: int, loader_workers: int) -> Check:
    """``/dev/shm`` against what ``workers`` processes with ``loader_workers`` each need.

    Example:
        >>> check_shm(8 * 2**30, workers=2, loader_workers=4).status
        'PASS'
    """
    if size is None:
        return Check("shared memory", SKIP, "no /dev/shm here")
    need = workers * (SHM_PER_WORKER + loader_workers * SHM_PER_LOADER_WORKER)
    detail = (
        f"/dev/shm is {size / MIB:.0f} MiB; {workers} worker(s) with {loader_workers} loader "
        f"worker(s) each want about {need / MIB:.0f} MiB"
    )
    advice = _SHM_FIX % (_quantity(need), _quantity(need).lower().rstrip("i"))
    if size < SHM_FLOOR:
        return Check("shared memory", FAIL, detail + " (a container's 64 MiB default?)", advice)
    if size < need:
        return Check("shared memory", WARN, detail, advice)
    return Check("shared memory", PASS, detail)


def check_grace_period(grace_s: float | None, checkpoint_dir: str | None) -> Check:
    """The grace period between SIGTERM and SIGKILL against the slowest recent save.

    Example:
        >>> check_grace_period(30.0, "/nonexistent").status
        'SKIP'
    """
    if grace_s is None:
        return Check(
            "grace period", SKIP, f"unknown: pass --grace-period S (or {GRACE_PERIOD_ENV})"
        )
    folder = local_path(checkpoint_dir) if checkpoint_dir is not None else None
    if folder is None:  # none given, or an object store: the checkpointer records no times
        where = "pass --checkpoint-dir" if checkpoint_dir is None else "an object store's saves"
        return Check("grace period", SKIP, f"{grace_s:g} s; no save time to compare ({where})")
    slowest = slowest_save(folder)
    if slowest is None:
        detail = f"{grace_s:g} s; no save recorded in {checkpoint_dir} yet (train once)"
        return Check("grace period", SKIP, detail)
    seconds, name = slowest
    detail = (
        f"{grace_s:g} s between SIGTERM and SIGKILL; the slowest recent save took "
        f"{seconds:.1f} s ({name})"
    )
    if seconds + _STEP_MARGIN_S <= grace_s:
        return Check("grace period", PASS, detail)
    wanted = int(2 * seconds + _STEP_MARGIN_S)
    return Check(
        "grace period",
        FAIL,
        detail + ": a stop would be killed mid-save, losing the progress "
        "since the previous checkpoint",
        f"raise terminationGracePeriodSeconds to {wanted} (`ddpkit k8s --grace-period {wanted}`)"
        "; or save asynchronously (Trainer(async_save=True)) or less state",
    )


_STEP_MARGIN_S = 10.0  # the step in flight finishes before the save begins


def check_checkpoint_shared(
    checkpoint_dir: str | None, pods: int | None, mounts: str | None = None
) -> Check:
    """Whether ``checkpoint_dir`` is on a file system that pods on other nodes see too
    (``pods``: the job's pod count; None outside a pod, where a local folder is fine).

    Example:
        >>> check_checkpoint_shared("s3://bucket/run", pods=2).status
        'PASS'
    """
    if checkpoint_dir is None:
        return Check("checkpoint folder", SKIP, "pass --checkpoint-dir to check it")
    folder = local_path(checkpoint_dir)  # file:// is this pod's disk, as the checkpointer takes it
    if folder is None:
        return Check(
            "checkpoint folder", PASS, f"{checkpoint_dir}: an object store, seen by every pod"
        )
    fstype, mount = filesystem_of(str(folder), mounts)
    detail = f"{checkpoint_dir} is on {fstype} (mounted at {mount})"
    if fstype.split(".")[0] in _SHARED_TYPES:
        return Check("checkpoint folder", PASS, detail + ", a shared file system")
    if pods is None:
        return Check("checkpoint folder", PASS, detail + ": local, fine for one machine")
    status = FAIL if fstype in ("overlay", "tmpfs") and pods > 1 else WARN
    return Check(
        "checkpoint folder",
        status,
        detail + ": a pod restarted on another node does not see these checkpoints and starts over",
        "mount a ReadWriteMany PersistentVolumeClaim there (`ddpkit k8s --checkpoint-pvc "
        "CLAIM`), or use checkpoint_dir='s3://bucket/run'",
    )


def filesystem_of(path: str, mounts: str | None = None) -> tuple[str, str]:
    """(file system type, mount point) of the mount holding ``path``: the longest match.

    Example:
        >>> filesystem_of("/data/run", "1 0 0:1 / / rw - overlay overlay rw\\n"
        ...               "2 1 0:2 / /data rw - nfs4 srv:/x rw\\n")
        ('nfs4', '/data')
    """
    text = mounts if mounts is not None else _read_mountinfo()
    target = os.path.abspath(path)
    best = ("unknown", "/")
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point, fstype = fields[4], line.split(" - ", 1)[1].split()[0]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[1]):
            best = (fstype, point)
    return best


def _read_mountinfo() -> str:
    try:
        return Path("/proc/self/mountinfo").read_text()
    except OSError:
        return ""


def grace_from(environ: Mapping[str, str]) -> float | None:
    """The grace period the pod spec declared (``DDPKIT_GRACE_PERIOD``), if any.

    Example:
        >>> grace_from({GRACE_PERIOD_ENV: "120"})
        120.0
    """
    return seconds_var(GRACE_PERIOD_ENV, environ)


def _quantity(size: int) -> str:
    """A Kubernetes quantity, rounded up to whole GiB: '2Gi'."""
    return f"{max(1, -(-size // 2**30))}Gi"
