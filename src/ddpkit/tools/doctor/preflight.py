"""Preflight checks on this machine: launcher variables, backend, NCCL, FileStore, threads.

Each check returns a :class:`Check`: PASS / WARN / FAIL / SKIP, a one-line detail carrying
the numbers, and the fix when it is not a PASS. A check never raises for what it finds; a
finding is its result. The network checks live in :mod:`ddpkit.tools.doctor.netcheck`; the
checks that run a script in :mod:`ddpkit.tools.doctor.probe`.

Example:
    >>> check_launcher({}).detail
    'no launcher: a world of one'
    >>> check_nccl(gpu_count=0, nccl_available=False).status
    'SKIP'
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddpkit._core.text import first_line
from ddpkit.env.initmethod import parse_init_method
from ddpkit.env.world import World, choose_backend
from ddpkit.errors import ConfigError
from ddpkit.runtime.filestore import holders_alive

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
STATUSES = (PASS, WARN, FAIL, SKIP)
_LAUNCHER_NAMES = {"torchrun": "torchrun", "slurm": "SLURM", "mpi": "OpenMPI"}


@dataclass(frozen=True)
class Check:
    """One check's verdict: ``status`` is PASS, WARN, FAIL or SKIP; ``fix`` says what to do.

    Example:
        >>> Check("master port", FAIL, "127.0.0.1:29500 is in use by pid 4242", "free it").line()
        'FAIL  master port: 127.0.0.1:29500 is in use by pid 4242'
    """

    name: str
    status: str
    detail: str
    fix: str | None = None

    def line(self) -> str:
        """The check's first line in ``ddpkit doctor``'s output (more detail lines follow it).

        Example:
            >>> Check("nccl", SKIP, "no GPU").line()
            'SKIP  nccl: no GPU'
        """
        first = self.detail.splitlines()[0] if self.detail else ""
        return f"{self.status:<4}  {self.name}: {first}"


def check_launcher(environ: Mapping[str, str]) -> Check:
    """The launcher's variables describe a consistent world (``World.detect`` succeeds).

    Example:
        >>> env = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
        >>> check_launcher(env).detail
        'torchrun: rank 1 of 4 (node 0, local rank 1)'
    """
    try:
        world = World.detect(environ)
    except ConfigError as err:
        return Check(
            "launcher", FAIL, str(err),
            "set the launcher's variables as a whole (or let `ddpkit run` set them), "
            "or unset them to run as a single process",
        )  # fmt: skip
    if not world.is_launched:
        return Check("launcher", PASS, "no launcher: a world of one")
    name = _LAUNCHER_NAMES.get(world.launcher, world.launcher)
    where = f"node {world.node_rank}, local rank {world.local_rank}"
    return Check("launcher", PASS, f"{name}: rank {world.rank} of {world.world_size} ({where})")


def backend_choice(environ: Mapping[str, str]) -> tuple[str, torch.device]:
    """The backend and device ``ddpkit.init()`` would use; CUDA's first GPU if detection fails.

    Example:
        >>> backend_choice({})[0] in ("gloo", "nccl")
        True
    """
    try:
        world = World.detect(environ)
    except ConfigError:  # reported by check_launcher; the backend is still worth trying
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        return choose_backend(None, device), device
    return world.backend, world.device


def check_backend(backend: str, device: torch.device) -> Check:
    """Create a 1-process group of ``backend`` on an in-memory store, all_reduce, destroy it.

    Example:
        >>> check_backend("gloo", torch.device("cpu")).detail
        'all_reduce on a 1-process group in ... ms'
    """
    name = f"backend {backend}"
    if not dist.is_available():
        return Check(name, FAIL, "this torch build has no torch.distributed", _BUILD_FIX)
    if dist.is_initialized():  # doctor must not tear down a group its caller relies on
        return Check(name, SKIP, "this process already has a process group; left alone")
    start = time.perf_counter()
    try:
        total = _one_process_all_reduce(backend, device)
    except (RuntimeError, ValueError) as err:  # c10d errors subclass RuntimeError
        detail = f"a 1-process {backend} group on {device} failed: {first_line(err)}"
        return Check(name, FAIL, detail, _backend_fix(backend))
    elapsed_ms = (time.perf_counter() - start) * 1000
    if total != 1.0:
        detail = f"all_reduce of 1.0 on a 1-process group returned {total}"
        return Check(name, FAIL, detail, _backend_fix(backend))
    return Check(name, PASS, f"all_reduce on a 1-process group in {elapsed_ms:.1f} ms")


def _one_process_all_reduce(backend: str, device: torch.device) -> float:
    # The store class's typed home (torch.distributed re-exports it untyped).
    from torch.distributed import HashStore

    try:
        dist.init_process_group(
            backend, store=HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30)
        )
        tensor = torch.ones(1, device=device)
        dist.all_reduce(tensor)
        return float(tensor.item())  # .item() waits for a GPU collective to finish
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


_BUILD_FIX = "install a torch build with distributed support (the wheels from pytorch.org have it)"


def _backend_fix(backend: str) -> str:
    if backend == "nccl":
        return (
            "check the driver with nvidia-smi and rerun with NCCL_DEBUG=INFO; to train on CPU "
            "meanwhile, pass backend='gloo' to ddpkit.init"
        )
    return (
        f"{backend} picks its network interface from GLOO_SOCKET_IFNAME or the hostname's "
        "address: see the socket interfaces and hostname checks"
    )


def check_nccl(gpu_count: int, nccl_available: bool, nccl: str | None = None) -> Check:
    """With GPUs, torch must have NCCL (ddpkit's backend for CUDA).

    Example:
        >>> check_nccl(gpu_count=4, nccl_available=False).status
        'FAIL'
    """
    if gpu_count == 0:
        return Check("nccl", SKIP, "no GPU")
    if nccl_available:
        return Check("nccl", PASS, f"NCCL {nccl or '(version unknown)'} for {gpu_count} GPU(s)")
    return Check(
        "nccl", FAIL, f"{gpu_count} GPU(s) visible but this torch build has no NCCL",
        "install a CUDA build of torch with NCCL (pip install torch --index-url "
        "https://download.pytorch.org/whl/cu124, matching your driver), or train with "
        "backend='gloo' (much slower on GPUs)",
    )  # fmt: skip


def check_file_store(init_method: str | None) -> Check:
    """A file:// init method's directory is writable and its file is not left from a dead run.

    Example:
        >>> check_file_store(None).status
        'SKIP'
    """
    if init_method is None:
        return Check("file store", SKIP, "no --init-method file:///PATH given")
    try:
        method = parse_init_method(init_method)
    except ConfigError as err:
        return Check("file store", FAIL, str(err), "pass a URL in one of the forms named")
    if method.kind != "file" or method.path is None:
        return Check("file store", SKIP, f"{init_method} does not use a FileStore")
    problem = _directory_problem(Path(method.path).parent)
    if problem is not None:
        return problem
    return _file_state(method.path)


def _directory_problem(directory: Path) -> Check | None:
    fix = (
        f"create it (mkdir -p {directory}) on a file system every rank can reach, or use "
        "another path"
    )
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        return Check("file store", FAIL, f"{directory} {what}", fix)
    try:
        handle, probe = tempfile.mkstemp(prefix=".ddpkit-doctor-", dir=directory)
        os.close(handle)
        os.unlink(probe)
    except OSError as err:
        detail = f"cannot create a file in {directory}: {err.strerror or err}"
        return Check("file store", FAIL, detail, f"make {directory} writable, or use another path")
    return None


def _file_state(path: str) -> Check:
    if not os.path.exists(path):
        return Check("file store", PASS, f"{path} is absent and its directory is writable")
    age = f"written {time.time() - os.stat(path).st_mtime:.0f} s ago"
    alive = holders_alive(path)
    if alive is False:
        return Check(
            "file store", WARN,
            f"{path} ({age}) is left by a run whose processes are gone (killed, or crashed)",
            f"nothing to do for ddpkit, which removes it at start; plain torch freezes on it: "
            f"rm {path}",
        )  # fmt: skip
    if alive is True:
        return Check(
            "file store", WARN, f"{path} ({age}) is in use by a running job",
            "wait for that job to end, or give this job its own file",
        )  # fmt: skip
    return Check(
        "file store", WARN,
        f"{path} ({age}) exists and this file system has no flock to tell who uses it",
        f"if no job is running with it: rm {path}",
    )  # fmt: skip


def check_threads(environ: Mapping[str, str], nproc: int | None, cores: int) -> Check:
    """CPU threads per worker x workers on this node fit in the usable cores.

    Example:
        >>> check_threads({"OMP_NUM_THREADS": "4", "LOCAL_WORLD_SIZE": "2"}, None, 2).status
        'WARN'
    """
    workers, who = workers_here(environ, nproc)
    threads, source = _threads_per_worker(environ, workers, from_ddpkit_run=who == "--nproc")
    if threads is None:
        detail = f"OMP_NUM_THREADS={environ.get('OMP_NUM_THREADS')!r} is not a positive integer"
        return Check("cpu threads", FAIL, detail, "export OMP_NUM_THREADS=N with N >= 1")
    total = threads * workers
    detail = (
        f"{workers} worker(s) ({who}) x {threads} thread(s) ({source}) = {total} thread(s) "
        f"on {cores} usable core(s)"
    )
    if total <= cores:
        return Check("cpu threads", PASS, detail)
    return Check(
        "cpu threads", WARN, f"{detail}: oversubscribed",
        f"export OMP_NUM_THREADS={max(1, cores // workers)} (cores / workers); `ddpkit run` "
        "sets it so when you leave it unset",
    )  # fmt: skip


def workers_here(environ: Mapping[str, str], nproc: int | None) -> tuple[int, str]:
    """This node's worker count and where it was read (LOCAL_WORLD_SIZE, --nproc).

    Example:
        >>> workers_here({"LOCAL_WORLD_SIZE": "4"}, None)
        (4, 'LOCAL_WORLD_SIZE')
    """
    raw = environ.get("LOCAL_WORLD_SIZE", "")
    if raw.isdigit() and int(raw) > 0:
        return int(raw), "LOCAL_WORLD_SIZE"
    if nproc is not None:
        return nproc, "--nproc"
    return 1, "this process"


def _threads_per_worker(
    environ: Mapping[str, str], workers: int, from_ddpkit_run: bool
) -> tuple[int | None, str]:
    raw = environ.get("OMP_NUM_THREADS")
    if raw is not None:
        return (int(raw) if raw.isdigit() and int(raw) > 0 else None), "OMP_NUM_THREADS"
    cores = torch.get_num_threads()
    if from_ddpkit_run:  # `ddpkit run` gives its workers cores // nproc threads by default
        return max(1, cores // workers), "ddpkit run's default"
    return cores, "torch's default"


def batch_advice(setup: Mapping[str, Any]) -> Check:
    """The effective global batch and whether the LR follows it (the tutorials' advice).

    ``setup`` is the Trainer's "setup" record (see :mod:`ddpkit.observe.benchreport`).

    Example:
        >>> setup = {"world_size": 2, "per_device_batch": 32, "global_batch": 64,
        ...          "batch_policy": "per_device", "lr": 0.001}
        >>> batch_advice(setup).status
        'WARN'
    """
    global_batch, per_device = setup.get("global_batch"), setup.get("per_device_batch")
    if not global_batch or not per_device:
        return Check("batch and lr", SKIP, "the run reported no batch size (no batch_size)")
    base = setup.get("base_batch") or _assumed_base(setup)
    scaling = setup.get("lr_scaling") or "none"
    lr = setup.get("lr")  # 3e-4 scaled by a batch ratio reads 0.00030000000000000003
    numbers = f"{_batch_text(setup)}; lr {f'{lr:.6g}' if isinstance(lr, float) else lr}"
    if global_batch == base or scaling != "none":
        return Check("batch and lr", PASS, f"{numbers} (base batch {base}, lr_scaling {scaling})")
    return Check(
        "batch and lr", WARN,
        f"{numbers} with lr_scaling none: a step sees {global_batch} samples, "
        f"{global_batch / base:g}x the batch of {base} the LR was set for",
        f"either split the batch so a step still sees {base}: plan_batch({base}, 'global') "
        f"(batch_policy='global'); or keep {per_device} per device and scale the LR with it: "
        f"plan_batch({per_device}, lr=..., lr_scaling='linear') for SGD, 'sqrt' for Adam",
    )  # fmt: skip


def _assumed_base(setup: Mapping[str, Any]) -> int:
    """Without a base_batch key: the batch_size argument plan_batch would have been given."""
    per_device, world_size = int(setup["per_device_batch"]), int(setup.get("world_size") or 1)
    return per_device * world_size if setup.get("batch_policy") == "global" else per_device


def _batch_text(setup: Mapping[str, Any]) -> str:
    per_device, world_size = int(setup["per_device_batch"]), int(setup.get("world_size") or 1)
    global_batch = int(setup["global_batch"])
    factors = [f"{per_device} per device", f"{world_size} rank(s)"]
    accumulate = global_batch // max(1, per_device * world_size)
    if accumulate > 1:
        factors.append(f"{accumulate} micro-steps")
    policy = setup.get("batch_policy") or "per_device"
    return f"global batch {global_batch} = {' x '.join(factors)} (batch_policy {policy})"
