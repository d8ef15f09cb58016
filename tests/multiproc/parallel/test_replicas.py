"""The replica check: identical DDP replicas pass, a drifting one is caught at the next check."""

from __future__ import annotations

import pytest

import ddpkit
from helpers import mp_workers as workers

pytestmark = pytest.mark.multiproc


def test_a_replica_perturbed_on_one_rank_is_detected_at_the_next_check() -> None:
    with pytest.raises(ddpkit.WorkerFailedError) as failed:
        ddpkit.spawn(workers.train_with_replica_checks, 2, 2, 3)  # check every 2; drift at 3
    message = str(failed.value)
    assert "replicas diverged at step 4: rank 1 differs from rank 0 in 2.weight" in message
    assert "by up to 0.001" in message


def test_identical_replicas_pass_every_check() -> None:
    steps = ddpkit.spawn(workers.train_with_replica_checks, 2, 1, 10**6)  # never drifts
    assert steps == [5, 5]  # 40 samples / (2 ranks x 4): every step was checked and passed
