"""Every ``DDPKIT_*`` variable is named once, in ``_core/protocol.py``: a stray literal in
src/ (outside docstrings, whose examples quote them) fails here, naming file and line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import ddpkit._core.protocol as protocol

PACKAGE = Path(protocol.__file__).resolve().parents[1]
NAME = re.compile(r"DDPKIT_[A-Z0-9_]*[A-Z0-9]")  # a whole name; "DDPKIT_" alone is a prefix


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        body = getattr(node, "body", None) if isinstance(node, kinds) else None
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            found.add(id(body[0].value))
    return found


def stray_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    skip = docstrings(tree)
    return [
        f"{path.relative_to(PACKAGE)}:{node.lineno}: {NAME.search(node.value)[0]}"  # type: ignore[index]
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in skip and NAME.search(node.value)
    ]  # fmt: skip


def test_no_module_but_the_protocol_spells_a_ddpkit_variable() -> None:
    modules = [p for p in PACKAGE.rglob("*.py") if p.name != "protocol.py"]
    stray = [found for path in sorted(modules) for found in stray_names(path)]
    assert not stray, f"define these in _core/protocol.py and import them: {stray}"


def test_the_protocol_defines_each_name_once() -> None:
    values = [v for k, v in vars(protocol).items() if k.isupper() and isinstance(v, str)]
    names = [v for v in values if NAME.fullmatch(v)]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
