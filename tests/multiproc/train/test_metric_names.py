"""An epoch's metrics over the ranks cost one all-reduce when the ranks record the names they
agreed on the epoch before; when one rank records another name, the ranks agree on the union
first, that epoch only. 2 gloo workers, 4 epochs: rank 1 records ``aux`` in one epoch."""

from __future__ import annotations

import pytest

import ddpkit
from helpers import mp_workers

pytestmark = pytest.mark.multiproc


@pytest.mark.timeout(120)
@pytest.mark.parametrize("extra_in", [0, 2])
def test_a_name_one_rank_records_in_one_epoch_is_in_that_epochs_metrics_only(
    extra_in: int,
) -> None:
    names = ddpkit.spawn(mp_workers.metric_names_by_epoch, 2, extra_in)
    expected = [["aux", "loss"] if e == extra_in else ["loss"] for e in range(4)]
    assert names == [expected, expected]  # every rank's history, the same
