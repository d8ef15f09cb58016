"""The replica-group tests' teardown: no group of a failed test keeps running."""

from collections.abc import Iterator

import pytest

from helpers.replica_groups import stop_all


@pytest.fixture(autouse=True)
def _stop_groups() -> Iterator[None]:
    yield
    stop_all()
