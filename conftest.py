"""Root conftest: the docstring examples in src/ run as doctests, each with a fresh world."""

from collections.abc import Iterator

import pytest

import ddpkit


@pytest.fixture(autouse=True)
def _fresh_world_for_doctests() -> Iterator[None]:
    yield
    ddpkit.shutdown()
