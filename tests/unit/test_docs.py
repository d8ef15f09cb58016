"""The README stays a front door, and the documentation's links and figures stay true.

Checked without starting a process:

- README.md is at most 300 lines and 25,000 bytes;
- `make demo`, `make test` and `source .venv/bin/activate` are in its first 60 lines;
- every relative Markdown link in README.md and docs/*.md resolves: the file exists and, for a
  link with a #anchor, a heading of the target (or of the same file, for a bare #anchor) has
  that anchor, by GitHub's rule (lowercase; punctuation other than '-' and '_' removed; each
  space a '-'; a repeated heading gets -1, -2, ...);
- every figure in the README's "Measured figures" section (a number with a unit, such as
  `7.89 s`, `1.48x`, `286 MB`, or a decimal such as `0.990` or `1.5e-08`) occurs, as written,
  in docs/benchmarks.md, the one source of the project's measured figures.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
BENCHMARKS = REPO / "docs" / "benchmarks.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]

LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
# A number with its unit, or else a decimal: the forms a measured figure takes.
FIGURE = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?(?:e-\d+)?"
    r"(?: ?(?:ms|us|s|min|MB|MiB|GB/s|GB)\b|x\b|%)"
    r"|(?<![\w.])\d+\.\d+(?:e-\d+)?\b"
)


def _outside_code(text: str) -> list[tuple[int, str]]:
    """(line number, line) for every line not inside a fenced code block."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation but '-' and '_' removed,
    each space a '-'; link targets and inline-code backticks count by their text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a page's headings give, repeated headings numbered as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in _outside_code(page.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link outside code that points into the repository."""
    links = []
    for number, line in _outside_code(page.read_text()):
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        for target in LINK.findall(line):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            links.append((number, target))
    return links


def test_the_github_slug_rule_matches_the_anchors_the_docs_use() -> None:
    assert github_slug("`ddpkit bench`: the scaling table and charts") == (
        "ddpkit-bench-the-scaling-table-and-charts"
    )
    assert github_slug("A bad host or link: `ddpkit doctor --nodes`") == (
        "a-bad-host-or-link-ddpkit-doctor---nodes"
    )
    assert github_slug("Experiment trackers: MLflow, Weights & Biases") == (
        "experiment-trackers-mlflow-weights--biases"
    )
    assert github_slug("The step-time breakdown's cost") == "the-step-time-breakdowns-cost"


def test_the_readme_is_at_most_300_lines_and_25000_bytes() -> None:
    text = README.read_text()
    lines, size = text.count("\n"), len(text.encode())
    assert lines <= 300, f"README.md has {lines} lines; at most 300 (move depth into docs/)"
    assert size <= 25_000, f"README.md has {size} bytes; at most 25,000 (move depth into docs/)"


@pytest.mark.parametrize("command", ["make demo", "make test", "source .venv/bin/activate"])
def test_the_first_commands_are_in_the_readmes_first_60_lines(command: str) -> None:
    first = README.read_text().splitlines()[:60]
    assert any(command in line for line in first), (
        f"README.md: {command!r} is not in the first 60 lines"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_resolves_anchors_included(page: Path) -> None:
    broken = []
    for number, target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(REPO)}:{number}: ({target})"
        if not resolved.exists():
            broken.append(f"{where}: {path} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{where}: no heading of {resolved.name} has the anchor #{anchor}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_readme_figure_is_in_docs_benchmarks() -> None:
    text = README.read_text()
    assert "\n## Measured figures\n" in text, "README.md has no '## Measured figures' section"
    section = text.split("\n## Measured figures\n", 1)[1].split("\n## ", 1)[0]
    benchmarks = BENCHMARKS.read_text()
    missing, figures = [], 0
    for line in section.splitlines():
        line = re.sub(r"\]\([^)]*\)", "]", line)  # link targets hold no figures
        for figure in FIGURE.findall(line):
            figures += 1
            if figure not in benchmarks:
                missing.append(f"{figure!r} in README line: {line.strip()}")
    assert figures, "README.md's Measured figures section quotes no figure"
    assert not missing, "figures docs/benchmarks.md does not give:\n" + "\n".join(missing)
