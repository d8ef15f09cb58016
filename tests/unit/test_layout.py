"""The package's shape: each entry point imports only its own layers, and private internals
are reached in ``_compat`` alone (module size is a review list, not a cap:
tests/helpers/longest.py).

Each import check runs in a fresh interpreter, so what it sees is what the entry point
itself loads.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ddpkit

PACKAGE = Path(ddpkit.__file__).parent
WORKER_SIDE = ("ddpkit.runtime", "ddpkit.train", "ddpkit.parallel", "ddpkit.data",
               "ddpkit.checkpoint", "ddpkit.compiling", "ddpkit.tools")  # fmt: skip


def loaded_after(code: str) -> list[str]:
    """The ddpkit and torch modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    names = done.stdout.strip().splitlines()[-1].split()
    return [name for name in names if name.split(".")[0] in ("ddpkit", "torch")]


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


# What reaching into torch, torchft or CPython looks like: a private module or name imported,
# or one of the private attributes ddpkit knows it uses (ddpkit._compat names each).
_PRIVATE_ATTRIBUTES = re.compile(
    r"(?<!self)\._(HEADER_DIR|HEADER_LOCK_DIR|precompile_header|client|quorum|run_exitfuncs|"
    r"threading_atexits|getframe|load_from_address|streaming_load)\b|\bos\._exit\s*="
)


def _private_imports(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] in ("torch", "torchft") and any(p.startswith("_") for p in parts[1:]):
                found.append(f"line {node.lineno}: {name}")
    return found


def test_private_internals_are_reached_in_the_compat_package_only() -> None:
    """Everything ddpkit takes from inside torch, torchft or CPython goes through
    ddpkit._compat, where each is checked against the releases it was tested on (torch's
    dynamo by its module name, imported whole, is the one public-in-practice exception)."""
    reached = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "_compat":
            continue
        source = path.read_text()
        found = [f for f in _private_imports(ast.parse(source)) if "torch._dynamo'" not in f]
        found += [f"line {source[: m.start()].count(chr(10)) + 1}: {m.group(0)}"
                  for m in _PRIVATE_ATTRIBUTES.finditer(source)]  # fmt: skip
        if found:
            reached[str(path.relative_to(PACKAGE))] = found
    assert reached == {}
