"""The package's shape: small modules, and each entry point imports only its own layers.

Each import check runs in a fresh interpreter, so what it sees is what the entry point
itself loads.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ddpkit

PACKAGE = Path(ddpkit.__file__).parent
MAX_LINES = 400
WORKER_SIDE = ("ddpkit.runtime", "ddpkit.train", "ddpkit.parallel", "ddpkit.data",
               "ddpkit.checkpoint", "ddpkit.tools")  # fmt: skip


def loaded_after(code: str) -> list[str]:
    """The ddpkit and torch modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    names = done.stdout.strip().splitlines()[-1].split()
    return [name for name in names if name.split(".")[0] in ("ddpkit", "torch")]


def test_no_module_is_over_400_lines() -> None:
    sizes = {p.relative_to(PACKAGE): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {path: n for path, n in sizes.items() if n > MAX_LINES} == {}


def test_import_ddpkit_imports_neither_torch_nor_any_layer() -> None:
    loaded = loaded_after("import ddpkit")
    assert "torch" not in loaded
    assert [m for m in loaded if m.startswith((*WORKER_SIDE, "ddpkit.launch"))] == []


def test_the_worker_bootstrap_imports_no_torch() -> None:
    # Every worker of `ddpkit run` starts here, plain torchrun scripts included.
    loaded = loaded_after("import ddpkit.launch.worker")
    assert "torch" not in loaded


def test_a_launch_over_ssh_reads_its_command_line_without_torch() -> None:
    # The machine that starts `ddpkit run --hosts` runs no worker: torch would cost it 0.85 s.
    loaded = loaded_after("from ddpkit.cli import parse\nparse(['run', '--hosts', 'a,b', 't.py'])")
    assert "torch" not in loaded and "ddpkit.launch.quickparse" in loaded


def test_a_warm_server_starts_before_the_launcher_imports_torch() -> None:
    # Side by side on two cores: the server's import of torch and dynamo, and the launcher's.
    probe = """
import sys
from ddpkit.launch import command
torch_then = []
command.start_warm_server = lambda env: torch_then.append("torch" in sys.modules)
from ddpkit.cli import parse
parse(["run", "--run-path", "--start-method", "forkserver", "--nproc", "2", "t.py"])
print(torch_then)"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["[False,", "True]"]  # the early start, then parse()'s no-op


@pytest.mark.parametrize("entry", ["ddpkit.init", "ddpkit.prepare_model"])
def test_the_training_api_imports_no_diagnostics(entry: str) -> None:
    loaded = loaded_after(f"import ddpkit\n{entry}")
    assert [m for m in loaded if m.startswith(("ddpkit.tools", "ddpkit.launch"))] == []
    assert "torch.distributed.fsdp" not in loaded


def test_ddpkit_run_imports_no_worker_side_code() -> None:
    loaded = loaded_after("from ddpkit.cli import parse\nparse(['run', '--nproc', '2', 't.py'])")
    assert [m for m in loaded if m.startswith(WORKER_SIDE)] == []
    assert "torch.distributed.fsdp" not in loaded
