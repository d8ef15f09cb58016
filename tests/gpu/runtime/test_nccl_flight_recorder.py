"""GPU tier: NCCL's Flight Recorder as ddpkit arms it (skipped without a GPU)."""

from __future__ import annotations

import ddpkit
from helpers import mp_workers
from helpers.gpus import needs_gpus

pytestmark = needs_gpus(1)


def test_nccl_collectives_are_recorded_with_ddpkits_defaults() -> None:
    (found,) = ddpkit.spawn(mp_workers.nccl_flight_recorder, 1)
    assert found["backend"] == "nccl"
    assert found["env"]["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    # torch's elastic agent gives each worker it starts 1 (TearDown) unless the launcher's
    # environment names one, and ddpkit keeps a value already set; 3 where nothing set it.
    # Either way a failed collective stops the rank instead of leaving it waiting.
    assert found["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] in ("1", "3")
    assert found["env"]["TORCH_FR_DUMP_TEMP_FILE"].endswith("-rank")
    assert any(c["op"] == "all_reduce" and c["sizes"] == [[3]] for c in found["collectives"])
