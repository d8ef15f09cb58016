"""A compiled model's kernels kept with the run's checkpoints, so a restart does not compile again.

``torch.compile`` keeps what it built (inductor's FX graph cache, AOTAutograd's cache, the
compiled kernels) under ``TORCHINDUCTOR_CACHE_DIR``, by default in the machine's ``/tmp``: a
restarted job on the same machine finds it, a job resumed on another node (a pod recreated
elsewhere, a requeued SLURM job) starts with none and every rank compiles again. When a
compiled model trains with a local ``checkpoint_dir``, the loop points the cache at
``<checkpoint_dir>/compile-cache/<fingerprint>/`` instead, so whoever resumes the run from
that folder reuses the kernels (measured: 8.84 s to compile a small MLP's step, 1.28 s
from the kept cache).

torch's cache keys do not hold the CPU's vector instruction set: kernels built under AVX-512
and loaded under AVX2 ran and gave a NaN loss, without a warning. So the folder is named by a
fingerprint of what the kernels depend on (torch's version and build, Python, the machine,
the CPU's capability, CUDA's version and the GPU), and a machine that differs compiles anew
in a folder of its own.

A ``TORCHINDUCTOR_CACHE_DIR`` the user set (a node-local scratch, often) stays torch's cache,
and the run's folder still keeps the kernels: the files the run added to the user's folder
are copied there after the first step, and a resume whose folder lacks kernels (a new node)
is seeded from there before it compiles (:func:`seed_users_cache`).

Example:
    >>> sorted(fingerprint(torch.device("cpu")))
    ['cpu', 'cuda', 'gpu', 'machine', 'python', 'torch']
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from collections.abc import Iterable, MutableMapping
from pathlib import Path

import torch
from torch import nn

from ddpkit._compat.inductor import (
    compile_counts,
    default_cache_dir,
    record_header_builds,
    use_header_folder,
)
from ddpkit._core.atomicfile import atomic_write
from ddpkit._core.log import logger
from ddpkit._core.privatefolder import check_private, private_folder
from ddpkit._core.text import short_digest
from ddpkit.compiling.wrap import uncompiled

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # torch's own setting, read each time it is used
CACHE_FOLDER = "compile-cache"
FINGERPRINT_FILE = "fingerprint.json"  # what the folder's kernels were built for
HEADERS = "precompiled_headers"  # inductor's C++ precompiled headers, kept with the run
_NOT_KERNELS = (FINGERPRINT_FILE, HEADERS)  # what a kernel folder holds besides the kernels


def fingerprint(device: torch.device) -> dict[str, str]:
    """What compiled kernels depend on beyond torch's own cache keys.

    Example:
        >>> fingerprint(torch.device("cpu"))["gpu"]
        ''
    """
    gpu = ""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        gpu = f"{torch.cuda.get_device_name(device)} sm_{major}{minor}"
    return {
        "torch": f"{torch.__version__} {torch.version.git_version}",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "cuda": torch.version.cuda or "",
        "gpu": gpu,
    }


def cache_folder(run_folder: Path, device: torch.device) -> Path:
    """The run's kernel cache for this machine: ``compile-cache/<fingerprint's hash>``.

    Example:
        >>> cache_folder(Path("runs/gpt"), torch.device("cpu")).parent
        PosixPath('runs/gpt/compile-cache')
    """
    text = json.dumps(fingerprint(device), sort_keys=True)
    return run_folder / CACHE_FOLDER / short_digest(text)


def keep_with_run(
    run_folder: Path, device: torch.device, environ: MutableMapping[str, str] | None = None
) -> Path | None:
    """Point torch's compile cache at the run's folder (for what is compiled from now on);
    the folder, or None when the user chose a cache of their own. The folder is private
    (:mod:`ddpkit._core.privatefolder`): one that another user owns or others can write is
    refused with :class:`~ddpkit.errors.UnsafeFolderError`, never loaded from.

    Example::

        keep_with_run(Path("runs/gpt"), world.device)   # runs/gpt/compile-cache/3f0c...
    """
    env = os.environ if environ is None else environ
    if user_chose_cache(env):
        return None
    run_folder.mkdir(parents=True, exist_ok=True)  # the user's, as the checkpoints make it
    folder = private_folder(cache_folder(run_folder, device))  # below it: 0700
    check_private(folder.parent)  # compile-cache/: where a folder of kernels could be swapped
    use_cache_folder(folder, device, env)
    return folder


def seed_users_cache(
    run_folder: Path, device: torch.device, environ: MutableMapping[str, str] | None = None
) -> tuple[Path, Path, int] | None:
    """When the user chose ``TORCHINDUCTOR_CACHE_DIR``: their folder, the run's kernel
    folder beside its checkpoints, and how many of the run's files were copied into theirs,
    which held no kernels (0: it had some, or the run has none yet). None: no folder chosen.

    Example::

        seed_users_cache(Path("runs/gpt"), world.device)   # (scratch, runs/gpt/..., 41)
    """
    env = os.environ if environ is None else environ
    if not user_chose_cache(env):
        return None
    run_folder.mkdir(parents=True, exist_ok=True)
    kept = private_folder(cache_folder(run_folder, device))
    check_private(kept.parent)
    facts = json.dumps(fingerprint(device), indent=1).encode()
    atomic_write(kept / FINGERPRINT_FILE, lambda out: out.write(facts))
    users = Path(env[CACHE_ENV])
    seeded = 0 if holds_kernels(users) else copy_kernels(kept, users)
    return users, kept, seeded


def copy_kernels(source: Path, target: Path, since: float | None = None) -> int:
    """``source``'s cache files that ``target`` lacks (modified at ``since`` or later, if
    given) copied into it, each whole: copied beside its place, then renamed into it (torch
    may read the folder meanwhile). The fingerprint and the headers stay where they are.

    Example::

        copy_kernels(users_cache, run_kernels, since=started)   # what this run compiled
    """
    copied = 0
    for file in sorted(source.rglob("*")):
        relative = file.relative_to(source)
        if not file.is_file() or file.is_symlink() or relative.parts[0] in _NOT_KERNELS:
            continue
        if relative.name.startswith(".") or (since is not None and file.stat().st_mtime < since):
            continue
        place = target / relative
        if place.exists():
            continue
        place.parent.mkdir(parents=True, exist_ok=True)
        partial = place.with_name(f".{place.name}.{os.getpid()}")
        shutil.copy2(file, partial)
        os.replace(partial, place)
        copied += 1
    return copied


def holds_kernels(folder: Path) -> bool:
    """Whether ``folder`` holds anything compiled (not only its fingerprint).

    Example:
        >>> holds_kernels(Path("/nonexistent"))
        False
    """
    if not folder.is_dir():
        return False
    return any(entry.name not in _NOT_KERNELS for entry in folder.iterdir())


def user_chose_cache(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether ``TORCHINDUCTOR_CACHE_DIR`` names a folder of the user's (not torch's default).

    Example:
        >>> user_chose_cache({CACHE_ENV: "/scratch/me/inductor"})
        True
    """
    chosen = (os.environ if environ is None else environ).get(CACHE_ENV)
    return (
        chosen is not None
        and chosen != ""
        and (Path(chosen).resolve() != Path(_torch_default()).resolve())
    )


def use_cache_folder(
    folder: Path, device: torch.device, environ: MutableMapping[str, str] | None = None
) -> None:
    """Make ``folder`` torch's compile cache, its fingerprint written in it.

    Example::

        use_cache_folder(folder, world.device)
    """
    facts = json.dumps(fingerprint(device), indent=1).encode()
    atomic_write(folder / FINGERPRINT_FILE, lambda out: out.write(facts))
    (os.environ if environ is None else environ)[CACHE_ENV] = str(folder.resolve())


_headers_used: list[str] = []  # what this process's compiles used, to keep after its first step


def keep_headers_with(folder: Path) -> bool:
    """Have inductor's C++ precompiled headers travel with the run in ``folder``; whether
    torch could be asked to.

    torch builds a header (about 150 MB, 4 s on 2 CPU cores) in the machine's ``/tmp``
    whatever ``TORCHINDUCTOR_CACHE_DIR`` says, and needs it before loading even kernels it
    finds in the cache: on a new node a restart rebuilt it, most of what the restart then
    spent on compiling. A resume takes the run's headers (torch names each by the compiler
    and its flags, so another compiler builds its own beside them); a new run uses the
    machine's and keeps those it used (:func:`keep_used_headers`).

    Example::

        keep_headers_with(keep_with_run(Path("runs/gpt"), world.device))
    """
    kept = folder / HEADERS
    if kept.is_dir():
        return use_header_folder(str(kept))
    return record_header_builds(_headers_used.append)


def keep_used_headers(folder: Path) -> None:
    """After the first step: the headers it used copied into ``folder``, whole or not at all
    (another rank of the node may be copying them too; a half-copied header would fail the
    compiler).

    Example::

        keep_used_headers(folder)   # once the first step compiled
    """
    kept = folder / HEADERS
    if kept.exists() or not _headers_used:
        return
    partial = folder / f".{HEADERS}.{os.getpid()}"
    try:
        partial.mkdir()
        for header in sorted(set(_headers_used)):
            for file in (Path(header), Path(f"{header}.gch")):
                if file.exists():
                    shutil.copy2(file, partial / file.name)
        partial.rename(kept)  # fails if another rank's copy got there first
    except OSError as err:
        shutil.rmtree(partial, ignore_errors=True)
        if not kept.is_dir():  # not another rank's copy that won: this node's copy failed
            logger.warning(
                f"the precompiled headers were not kept with the run in {kept} ({err}); a "
                "resume on another node builds them again (about 4 s)"
            )


def _torch_default() -> str:
    """The folder torch uses when none is set (it writes it into the environment once used)."""
    return default_cache_dir()


def any_compiled(models: Iterable[nn.Module]) -> bool:
    """Whether any of ``models`` is compiled (``prepare_model(compile=...)``).

    Example:
        >>> any_compiled([torch.nn.Linear(1, 1)])
        False
    """
    return any(uncompiled(model) is not model for model in models)


def compile_summary(seconds: float) -> str:
    """What compiling cost this rank up to now, for the line after the first step: the
    graphs torch found in the cache and those it compiled (inductor's FX graph cache).

    Example::

        compile_summary(9.4)   # 'first step 9.4 s, compiling included: 12 graph(s) ...'
    """
    found, built = cache_counts()
    return (
        f"first step {seconds:.1f} s, compiling included: {found} graph(s) from the compile "
        f"cache, {built} compiled"
    )


def cache_counts() -> tuple[int, int]:
    """The graphs this process found in inductor's FX graph cache, and those it compiled.

    Example::

        found, built = cache_counts()
    """
    found, built, _ = compile_counts() or (0, 0, 0)
    return found, built


# Said when a compiled model's first step captured no graph: torch ran it eagerly, silently.
RAN_EAGERLY = (
    "compile=True compiled nothing: Dynamo captured no graph in the first step, so the model "
    "ran eagerly. Under DDP torch skips the forward of a torch.nn container used as the whole "
    "model (nn.Sequential: after DDP's graph break its frame is torch's own); give the model "
    "a class of your own whose forward calls it (examples/wine.py's WineNet)"
)


def captured_graphs() -> int:
    """The graphs Dynamo captured in this process (any backend, cached or not).

    Example::

        if captured_graphs() == 0: logger.warning(RAN_EAGERLY)
    """
    counts = compile_counts()
    return 1 if counts is None else counts[2]  # unknown: not said to have compiled nothing
