"""main_first's wait, on a real in-process store: done, failed, stalled, never reached."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from ddpkit.errors import MainRankStalledError
from ddpkit.runtime.mainfirst import _beating, _wait_for_main


def test_the_wait_ends_when_rank0s_block_is_done_however_long_it_beats() -> None:
    store = dist.HashStore()

    def rank0() -> None:
        with _beating(store, "0", "t.py:3", timeout_s=0.5):
            time.sleep(1.5)  # three times the timeout below, beating all along

    thread = threading.Thread(target=rank0)
    thread.start()
    _wait_for_main(store, "0", "t.py:3", timeout_s=0.5)
    thread.join()
    assert bytes(store.get("0/outcome")) == b"done"


def test_a_failed_block_is_named_at_once() -> None:
    store = dist.HashStore()
    with pytest.raises(RuntimeError), _beating(store, "0", "t.py:3"):
        raise RuntimeError("download failed")
    with pytest.raises(MainRankStalledError, match=r"rank 0 failed inside main_first\(\) at t"):
        _wait_for_main(store, "0", "t.py:3", timeout_s=5)


def test_silence_is_named_stalled_or_never_reached() -> None:
    store = dist.HashStore()
    with pytest.raises(MainRankStalledError, match=r"did not reach main_first\(\) at t.py:3"):
        _wait_for_main(store, "0", "t.py:3", timeout_s=0.3)
    store.add("1/beat", 1)  # rank 0 entered, then stopped beating
    with pytest.raises(MainRankStalledError, match=r"stopped inside main_first\(\) at t.py:3: no"):
        _wait_for_main(store, "1", "t.py:3", timeout_s=0.3)
