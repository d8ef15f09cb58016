"""MkDocs hooks for `make docs`: the README is the site's home page, and the examples the
pages link to are copied beside them, so the links that work on GitHub work in the site and
are checked by the strict build; and a griffe extension that reads the docstrings'
``Example:`` sections as examples.

On GitHub the README links to ``docs/x.md`` and the pages link back to ``../README.md`` and
``../examples/gpt.py``; in the site the README is ``index.md`` among the pages. Each link is
rewritten to its place in the site before MkDocs validates it, so a broken one still fails.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from griffe import AliasResolutionError, Extension, NameResolutionError, Object
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

REPO = Path(__file__).resolve().parents[1]
HOME = "index.md"
EXAMPLES = "examples"
_LINK = re.compile(r"\]\((?!https?://|#)([^)\s]+)\)")
_EXAMPLE = re.compile(r"^(\s*)Example:$", re.MULTILINE)
_ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc):`~?([\w.]+)`")


def on_files(files: Files, config: Any) -> Files:
    """Add the README as the home page and the examples the pages link to."""
    files.append(File.generated(config, HOME, abs_src_path=str(REPO / "README.md")))
    for example in sorted((REPO / EXAMPLES).glob("*.py")):
        uri = f"{EXAMPLES}/{example.name}"
        files.append(File.generated(config, uri, abs_src_path=str(example)))
    return files


def on_page_markdown(markdown: str, page: Page, **_: Any) -> str:
    """Links as the site holds their targets: the README's ``docs/x.md`` is ``x.md``; a page's
    ``../README.md`` is ``index.md`` and ``../examples/y.py`` is ``examples/y.py``."""
    home = page.file.src_uri == HOME
    return _LINK.sub(lambda found: f"]({_in_site(found[1], home)})", markdown)


def _in_site(target: str, from_home: bool) -> str:
    if from_home:
        return target.removeprefix("docs/")
    if target.startswith("../README.md"):
        return HOME + target.removeprefix("../README.md")
    return target.removeprefix("../")


class ExampleSections(Extension):
    """Griffe extension (mkdocs.yml names it): ddpkit's docstrings head their doctests
    ``Example:``, which doctest runs and Google style spells ``Examples:``; read them as the
    examples section, so the site shows them as code. Sphinx roles (``:class:`X```), which
    ``help()`` shows as they are, are shown as code, and each one naming ddpkit's own code
    must resolve (in the docstring's scope, or as a full ``ddpkit.`` path) once the package
    is loaded: a stale one is a warning, which the strict build turns into a failure."""

    def __init__(self) -> None:
        super().__init__()
        self.roles: list[tuple[Object, str]] = []

    def on_instance(self, *, obj: Object, **_: Any) -> None:
        if obj.docstring is not None:
            self.roles += [(obj, target) for target in _ROLE.findall(obj.docstring.value)]
            text = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = _ROLE.sub(r"``\1``", text)

    def on_package(self, *, pkg: Object, **_: Any) -> None:
        for obj, target in self.roles:
            if obj.package is pkg and not _resolves(obj, target):
                _log.warning(f"{obj.path}: its docstring names {target}, which is not there")


_log = logging.getLogger("mkdocs.hooks.docstring_roles")  # a warning fails the strict build


def _resolves(obj: Object, target: str) -> bool:
    """Whether ``target`` names an object of ddpkit's that exists (other packages' names are
    not checked here)."""
    head, _, rest = target.partition(".")
    if not head:  # ``.sibling``: in the docstring's own module (a package's), or beside it
        module = obj if obj.is_module else obj.module
        return any(_exists(obj, f"{where}{target}") for where in (module.path, module.parent.path))
    if head == "ddpkit":
        path = target
    else:
        try:
            path = obj.resolve(head) + (f".{rest}" if rest else "")
        except NameResolutionError:
            return False
    return path.split(".")[0] != "ddpkit" or _exists(obj, path)


def _exists(obj: Object, path: str) -> bool:
    try:
        obj.modules_collection[path]
    except (KeyError, AliasResolutionError):
        return False
    return True
