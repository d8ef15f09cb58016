"""The facts ``ddpkit doctor`` reports: versions, backends, devices, network, variables.

Everything here only reads; nothing starts a process group or a process. Each fact that a
build or platform may lack (cuDNN on a CPU build, NCCL, interface addresses off Linux) is
``None`` rather than an error, so the report always completes.

Example:
    >>> facts = collect({"RANK": "0", "WORLD_SIZE": "1", "HOME": "/root"})
    >>> facts["env"]
    {'RANK': '0', 'WORLD_SIZE': '1'}
    >>> sorted(facts["backends"])
    ['gloo', 'mpi', 'nccl']
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from ddpkit._core.system import interface_ipv4, interface_names, usable_cores
from ddpkit.env.world import World
from ddpkit.errors import ConfigError

LAUNCHER_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "JOB_COMPLETION_INDEX",  # an indexed Job's (JobSet, TrainJob): a Kubernetes contract
)
SOCKET_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
_OTHER_VARS = ("TORCH_DISTRIBUTED_DEBUG", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
_PREFIXES = ("TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "NCCL_", "DDPKIT_", "PET_",
             "VC_", "TORCHX_", "KUBEFLOW_TRAINER_")  # fmt: skip


def collect(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """All facts as plain values (the ``environment`` part of ``ddpkit doctor --json``).

    Example:
        >>> collect({})["world"]["launcher"]
        'none'
    """
    env = os.environ if environ is None else environ
    return {
        "versions": versions(),
        "backends": backends(),
        "cpu": cpu(),
        "gpus": gpus(),
        "host": host(),
        "interfaces": interfaces(),
        "env": distributed_env(env),
        "world": world_facts(env),
    }


def versions() -> dict[str, str | None]:
    """Python, torch, CUDA, cuDNN and NCCL versions (None where this build has none).

    Example:
        >>> versions()["torch"] == torch.__version__
        True
    """
    cudnn_module = torch.backends.cudnn
    available = cudnn_module.is_available()  # type: ignore[no-untyped-call]
    cudnn = cudnn_module.version() if available else None  # type: ignore[no-untyped-call]
    return {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": str(cudnn) if cudnn else None,
        "nccl": nccl_version(),
    }


def nccl_version() -> str | None:
    """NCCL's version as "2.21.5", or None when torch was built without it (CPU builds).

    Example:
        >>> nccl_version() is None or nccl_version().count(".") >= 2
        True
    """
    try:
        parts = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    except (AttributeError, RuntimeError):  # CPU builds lack torch._C._nccl_version
        return None
    if isinstance(parts, int):  # torch < 1.13 returned one packed integer
        return str(parts)
    return ".".join(str(part) for part in parts)


def backends() -> dict[str, bool]:
    """Which torch.distributed backends this build of torch has.

    Example:
        >>> isinstance(backends()["gloo"], bool)
        True
    """
    if not dist.is_available():
        return {"gloo": False, "nccl": False, "mpi": False}
    return {
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "mpi": dist.is_mpi_available(),
    }


def cpu() -> dict[str, int]:
    """Cores this process may run on (its affinity mask), and all the machine has.

    Example:
        >>> cpu()["usable_cores"] >= 1
        True
    """
    return {"usable_cores": usable_cores(), "total_cores": os.cpu_count() or 1}


def gpus() -> list[dict[str, Any]]:
    """The visible CUDA GPUs: index, name and total memory in GiB (empty without CUDA).

    Example:
        >>> gpus() if not torch.cuda.is_available() else []
        []
    """
    if not torch.cuda.is_available():
        return []
    found = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        memory = round(props.total_memory / 2**30, 1)
        found.append({"index": index, "name": props.name, "memory_gib": memory})
    return found


def host() -> dict[str, str]:
    """This machine's hostname and fully qualified name (what torch's elastic agent advertises).

    Example:
        >>> host()["hostname"] == socket.gethostname()
        True
    """
    return {"hostname": socket.gethostname(), "fqdn": socket.getfqdn()}


def interfaces() -> list[dict[str, str | None]]:
    """Network interfaces with their IPv4 address (None when it has none, or off Linux).

    Example:
        >>> any(i["name"] in ("lo", "lo0") for i in interfaces())
        True
    """
    return [{"name": name, "ipv4": interface_ipv4(name)} for name in interface_names()]


def distributed_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that steer distributed training, sorted by name; nothing else.

    Example:
        >>> distributed_env({"SLURM_JOB_ID": "7", "PATH": "/bin", "NCCL_DEBUG": "INFO"})
        {'NCCL_DEBUG': 'INFO', 'SLURM_JOB_ID': '7'}
    """
    exact = set(LAUNCHER_VARS) | set(SOCKET_VARS) | set(_OTHER_VARS)
    return {
        name: environ[name]
        for name in sorted(environ)
        if name in exact or name.startswith(_PREFIXES)
    }


def world_facts(environ: Mapping[str, str]) -> dict[str, str | int | None]:
    """What ``ddpkit.init()`` would choose here, or the error it would stop with.

    Example:
        >>> world_facts({"RANK": "1"})["error"]
        'RANK is set but WORLD_SIZE is not: ...'
    """
    try:
        world = World.detect(environ)
    except ConfigError as err:
        return {"launcher": None, "describe": None, "error": str(err)}
    return {
        "launcher": world.launcher,
        "rank": world.rank,
        "world_size": world.world_size,
        "describe": world.describe(),
        "error": None,
    }
