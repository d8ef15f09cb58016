"""The constraint files make installs from agree with pyproject.toml, and the running venv holds
what its file pins: a fresh clone's `make test` gets what CI ran (Makefile: LOCK, `make lock`).
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
# Each constraint file: the extras make installs with it, and the Makefile line naming its torch.
LOCKS = {
    "constraints/test.txt": (
        ("test", "mlflow", "wandb", "docs", "hf", "examples"),
        r"TORCH_SPEC\s*\?=\s*torch==(\S+)",
    ),
    "constraints/test-oldest.txt": (("test",), r"OLDEST_TORCH\s*\?=\s*(\S+)"),
}


def pins(lock: str) -> dict[str, str]:
    """name -> version; torch and torchvision are comments (the venv's own pin installs them)."""
    found = {}
    for line in (REPO / lock).read_text().splitlines():
        entry = re.fullmatch(r"(?:# )?([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if entry:
            found[canonicalize_name(entry[1])] = entry[2]
        else:
            assert line.startswith("#") or not line.strip(), f"{lock}: not NAME==VERSION: {line}"
    return found


def asked_for(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in extras:
        wanted += project["optional-dependencies"][extra]
    return [Requirement(text) for text in wanted]


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_dependency_pyproject_asks_for_is_locked_at_a_version_it_admits(lock: str) -> None:
    pinned, extras = pins(lock), LOCKS[lock][0]
    disagree = []
    for requirement in asked_for(extras):
        version = pinned.get(canonicalize_name(requirement.name))
        if version is None or not requirement.specifier.contains(version, prereleases=True):
            disagree.append(f"{requirement} (locked: {version})")
    assert not disagree, f"pyproject.toml and {lock} disagree; run `make lock`: {disagree}"


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_each_lock_was_made_with_the_torch_its_venv_installs(lock: str) -> None:
    makefile = (REPO / "Makefile").read_text()
    wanted = re.search(LOCKS[lock][1], makefile, re.MULTILINE)[1]  # type: ignore[index]
    assert Version(pins(lock)["torch"]).public == Version(wanted).public, (lock, wanted)


def test_the_running_environment_holds_exactly_what_its_lock_pins() -> None:
    installed = Version(torch.__version__).public
    lock = next((f for f in LOCKS if Version(pins(f)["torch"]).public == installed), None)
    if lock is None:
        pytest.skip(f"torch {installed} is no locked one (a GPU build put in .venv by hand)")
    pinned = pins(lock)
    have = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    differ = {n: (have.get(n), v) for n, v in pinned.items() if have.get(n) not in (v, None)}
    missing = sorted(name for name in pinned if name not in have)
    # torch's own version is the pin's (2.13.0+cpu): compared above by its public part.
    differ.pop("torch", None)
    assert not differ, f"installed, locked in {lock}: {differ}; run make test to re-sync"
    assert not missing, f"locked in {lock} but not installed: {missing}"
    # the drift a lock exists to stop: a package installed by hand, or one a dependency
    # brought that the lock never saw (pip and setuptools come with the venv; ddpkit is ours)
    unlocked = sorted(set(have) - set(pinned) - {"ddpkit", "pip", "setuptools", "wheel"})
    assert not unlocked, (
        f"installed but not locked in {lock}: {unlocked}; uninstall them, or add them to "
        "pyproject.toml and run `make lock`"
    )
