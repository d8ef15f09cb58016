"""The review list `make lint` prints: the longest modules and functions of src/ddpkit.

Not a cap: a module is as long as its one idea needs (docs/development.md, "Cohesion"). The
list is where a reviewer looks first for a module holding two ideas, or a function doing
three things.

Example::

    python tests/helpers/longest.py        # the 8 longest of each
    python tests/helpers/longest.py 20
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "ddpkit"


def module_lengths() -> list[tuple[int, str]]:
    """Each module's line count and its path under src/ddpkit, longest first."""
    sizes = [(len(p.read_text().splitlines()), p.relative_to(PACKAGE).as_posix())
             for p in PACKAGE.rglob("*.py")]  # fmt: skip
    return sorted(sizes, reverse=True)


def function_lengths() -> list[tuple[int, str]]:
    """Each function's (or method's) line count and ``path:name``, longest first."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                where = f"{path.relative_to(PACKAGE).as_posix()}:{node.name}"
                found.append((node.end_lineno - node.lineno + 1, where))
    return sorted(found, reverse=True)


def main(count: int) -> None:
    print(f"review list (not a cap): the {count} longest modules and functions of src/ddpkit")
    for (lines, module), (flines, function) in zip(
        module_lengths()[:count], function_lengths()[:count], strict=True
    ):
        print(f"  {lines:5d}  {module:<40}  {flines:4d}  {function}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
