"""Where a compiled model's kernels are kept: the run's folder, named by the machine's
fingerprint, unless the user chose a cache of their own (no compiling here)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from ddpkit.compiling import cache as compilecache
from ddpkit.compiling.cache import (
    CACHE_ENV,
    HEADERS,
    cache_folder,
    copy_kernels,
    keep_headers_with,
    keep_used_headers,
    keep_with_run,
    seed_users_cache,
)
from ddpkit.compiling.keptkernels import kernels_for_run

CPU = torch.device("cpu")


def test_another_cpu_capability_is_another_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    here = cache_folder(Path("run"), CPU)
    assert cache_folder(Path("run"), CPU) == here  # stable
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2-ELSEWHERE")
    assert cache_folder(Path("run"), CPU) != here


def test_the_run_folder_becomes_torchs_cache_with_its_fingerprint(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    folder = keep_with_run(tmp_path, CPU, env)
    assert folder is not None and env[CACHE_ENV] == str(folder.resolve())
    facts = json.loads((folder / "fingerprint.json").read_text())
    assert facts["cpu"] == torch.backends.cpu.get_cpu_capability()


def test_a_cache_the_user_chose_is_left_alone(tmp_path: Path) -> None:
    env = {CACHE_ENV: str(tmp_path / "mine")}
    assert keep_with_run(tmp_path / "run", CPU, env) is None
    assert env[CACHE_ENV] == str(tmp_path / "mine") and not (tmp_path / "run").exists()


def test_an_eager_model_keeps_nothing(tmp_path: Path) -> None:
    assert kernels_for_run([torch.nn.Linear(2, 2)], tmp_path, None, CPU) is None
    assert not (tmp_path / "compile-cache").exists()


@pytest.fixture
def codecache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> object:
    """inductor's codecache, its header folder the machine's (here: a folder of the test's),
    put back afterwards; the header build a stand-in that writes a header and its .gch."""
    from torch._inductor import codecache as module

    if not hasattr(module, "_HEADER_DIR"):
        pytest.skip(f"torch {torch.__version__} names no precompiled-header folder")
    machines = tmp_path / "tmp" / "precompiled_headers"
    machines.mkdir(parents=True)
    monkeypatch.setattr(module, "_HEADER_DIR", str(machines))
    monkeypatch.setattr(module, "_HEADER_LOCK_DIR", str(machines / "locks"))

    def build(header: str, command_line: str) -> str:
        path = Path(module._HEADER_DIR) / f"{hash(command_line) & 0xFFFF:x}.h"
        path.write_text(f"#include <{header}>\n")
        Path(f"{path}.gch").write_bytes(b"\0" * 64)
        return str(path)

    monkeypatch.setattr(module, "_precompile_header", build)
    monkeypatch.setattr(compilecache, "_headers_used", [])
    return module


def test_a_new_run_keeps_the_headers_its_first_step_used(codecache: Any, tmp_path: Path) -> None:
    """torch rebuilt its precompiled header (150 MB, 4 s) before loading even cached kernels
    on a new node; a restart there now finds the run's."""
    run = tmp_path / "run"
    run.mkdir()
    assert keep_headers_with(run)
    used = codecache._precompile_header("torch/csrc/inductor/cpp_prefix.h", "g++ -O3")
    assert Path(used).parent == tmp_path / "tmp" / "precompiled_headers"  # the machine's
    keep_used_headers(run)
    kept = sorted(p.name for p in (run / HEADERS).iterdir())
    assert kept == [Path(used).name, f"{Path(used).name}.gch"]
    assert [p.name for p in run.iterdir()] == [HEADERS]  # no half-copied folder left
    keep_headers_with(run)  # the resume, on a node whose /tmp is empty
    assert Path(codecache._HEADER_DIR) == run / HEADERS


def test_a_torch_without_a_precompiled_header_folder_is_left_as_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from torch._inductor import codecache as module

    monkeypatch.delattr(module, "_HEADER_DIR", raising=False)  # torch 2.7's
    assert not keep_headers_with(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_server_forks_workers_without_the_cache_folder_torch_wrote_in_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A warm server's torch wrote its /tmp cache folder into the server's environment;
    workers forked from it took that for the user's choice and kept no kernels with the run."""
    from ddpkit.launch.warm import forkserver

    monkeypatch.setattr(forkserver, "_STARTING_ENV", {"PATH": "/usr/bin"})
    monkeypatch.setenv(CACHE_ENV, "/tmp/torchinductor_root")
    assert forkserver.forget_what_the_server_wrote() == [CACHE_ENV]
    assert CACHE_ENV not in os.environ
    monkeypatch.setattr(forkserver, "_STARTING_ENV", {CACHE_ENV: "/data/mine"})
    monkeypatch.setenv(CACHE_ENV, "/data/mine")  # the user's, set for the launch
    assert forkserver.forget_what_the_server_wrote() == [] and os.environ[CACHE_ENV]


def test_a_run_folders_kernels_others_can_write_are_refused(tmp_path: Path) -> None:
    """A checkpoint folder on a team share: a compile-cache/ folder its group can write may
    hold someone else's kernels; it is named and never made torch's cache."""
    from ddpkit.errors import UnsafeFolderError

    env: dict[str, str] = {}
    folder = keep_with_run(tmp_path, CPU, env)
    assert folder is not None and oct(folder.stat().st_mode & 0o777) == "0o700"
    folder.parent.chmod(0o775)
    with pytest.raises(UnsafeFolderError, match=r"compile-cache is not private: it is writable "
                       r"by its group \(mode 0775\)"):  # fmt: skip
        keep_with_run(tmp_path, CPU, {})
    folder.parent.chmod(0o700)
    folder.chmod(0o757)
    with pytest.raises(UnsafeFolderError, match="writable by everyone"):
        keep_with_run(tmp_path, CPU, {})


def test_a_users_empty_cache_is_seeded_from_the_runs_kernels(tmp_path: Path) -> None:
    env = {CACHE_ENV: str(tmp_path / "scratch")}
    first = seed_users_cache(tmp_path / "run", CPU, env)
    assert first is not None
    users, kept, seeded = first
    assert seeded == 0 and users == tmp_path / "scratch"  # the run had nothing yet
    assert (kept / "fingerprint.json").exists() and env[CACHE_ENV] == str(users)  # theirs
    (kept / "fxgraph" / "ab").mkdir(parents=True)
    (kept / "fxgraph" / "ab" / "graph").write_text("compiled")
    (kept / "precompiled_headers").mkdir()
    (kept / "precompiled_headers" / "h.gch").write_text("header")  # stays with the run
    again = seed_users_cache(tmp_path / "run", CPU, env)  # a resume on a new node
    assert again is not None and again[2] == 1
    assert (users / "fxgraph" / "ab" / "graph").read_text() == "compiled"
    assert (
        not (users / "precompiled_headers").exists() and not (users / "fingerprint.json").exists()
    )
    assert seed_users_cache(tmp_path / "run", CPU, env)[2] == 0  # type: ignore[index]  # has some


def test_only_what_the_run_added_to_the_users_cache_is_kept(tmp_path: Path) -> None:
    users, kept = tmp_path / "scratch", tmp_path / "kept"
    (users / "old").mkdir(parents=True)
    (users / "old" / "another-jobs").write_text("x")
    os.utime(users / "old" / "another-jobs", (1000.0, 1000.0))
    started = time.time() - 1
    (users / "new").mkdir()
    (users / "new" / "ours").write_text("y")
    (users / "new" / ".ours.tmp").write_text("being written")
    assert copy_kernels(users, kept, since=started) == 1
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()) == [
        "new/ours"
    ]
