"""docs/architecture.md's module index names every module of src/ddpkit, and no module that
is gone: a module added without a line there, or removed without its line, fails here."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "ddpkit"
INDEX_HEADING = "## Every module"


def modules_on_disk() -> set[str]:
    """``train/loop.py``-style paths of every module (a package's ``__init__`` is its folder's
    row in the map; ``__main__`` is ``python -m ddpkit``)."""
    files = PACKAGE.rglob("*.py")
    names = {f.relative_to(PACKAGE).as_posix() for f in files}
    return {n for n in names if not n.endswith(("__init__.py", "__main__.py"))}


def modules_in_index() -> set[str]:
    text = (REPO / "docs" / "architecture.md").read_text()
    assert INDEX_HEADING in text, f"docs/architecture.md has no '{INDEX_HEADING}' section"
    index = text.split(INDEX_HEADING, 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^- `([\w/]+\.py)`", index, re.MULTILINE))


def test_every_module_has_a_line_in_the_index() -> None:
    missing = sorted(modules_on_disk() - modules_in_index())
    assert not missing, f"docs/architecture.md '{INDEX_HEADING}' lacks: {missing}"


def test_the_index_names_no_module_that_is_gone() -> None:
    stale = sorted(modules_in_index() - modules_on_disk())
    assert not stale, f"docs/architecture.md '{INDEX_HEADING}' names modules now gone: {stale}"
