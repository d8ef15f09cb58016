"""Where a compiled model's kernels are kept: the run's folder, named by the machine's
fingerprint, unless the user chose a cache of their own (no compiling here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ddpkit.parallel.compilecache import CACHE_ENV, cache_folder, keep_with_run
from ddpkit.parallel.compiledrun import kernels_for_run

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
