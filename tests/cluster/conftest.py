"""A real one-node SLURM cluster for the tests in this folder, started once per session.

Where munge and SLURM are missing, root and apt-get install Debian's packages (munge,
slurmctld, slurmd, slurm-client) once; without them the tests are skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helpers.launch_helpers import ensure_debian_packages, metric_lines, wine_on_one_host
from helpers.netns import virtual_hosts
from helpers.slurm_cluster import PACKAGES, SlurmCluster, start_cluster


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    """The running cluster; torn down at the end, failing the session if a process is left."""
    ensure_debian_packages(PACKAGES)
    cluster = start_cluster()
    yield cluster
    left = cluster.stop()
    assert not left, f"processes of the test cluster outlived its teardown: {left}"


@pytest.fixture(scope="session")
def two_node_slurm() -> Iterator[SlurmCluster]:
    """A second cluster of two nodes, each a slurmd on a virtual host of its own (network
    namespace, address, host name); its controller listens on the hosts' switch."""
    ensure_debian_packages(PACKAGES)
    with virtual_hosts(2, prefix="dknode") as hosts:
        cluster = start_cluster(hosts)
        try:
            yield cluster
        finally:
            left = cluster.stop()
        assert not left, f"processes of the two-node cluster outlived its teardown: {left}"


@pytest.fixture
def cluster(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster, with an empty queue after each test whatever the test did."""
    yield slurm
    slurm.cancel_all()


@pytest.fixture(scope="session")
def wine_reference() -> list[str]:
    """examples/wine.py --epochs 5 under `ddpkit run --nproc 2`: what every launch must match."""
    return metric_lines(wine_on_one_host(epochs=5))
