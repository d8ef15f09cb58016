"""The warm server imports its preloads with the cyclic collector paused (a quarter of the
import's time here), freezes what they made, and every process it forks has the collector
on again, whatever it runs. Run in a fresh interpreter with the real preload list."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROBE = """
import gc, multiprocessing
from ddpkit.launch.warm.forkserver import PRELOADED

def report(queue):
    queue.put((gc.isenabled(), gc.get_freeze_count()))

if __name__ == "__main__":
    multiprocessing.set_forkserver_preload(list(PRELOADED))
    context = multiprocessing.get_context("forkserver")
    queue = context.Queue()
    child = context.Process(target=report, args=(queue,))
    child.start()
    print(*queue.get())
    child.join()
"""


def test_a_fork_of_the_server_collects_again_and_shares_the_preloads_frozen(
    tmp_path: Path,
) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    done = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    enabled, frozen = done.stdout.split()
    assert enabled == "True"  # turned back on at the fork, not left off from the server
    assert int(frozen) > 100_000  # torch's objects, frozen in the server before it forked


def test_outside_a_server_the_last_preload_freezes_nothing() -> None:
    """In a fresh interpreter: in this one, collecting the doctests imported it already."""
    probe = (
        "import gc; before = gc.get_freeze_count(); import ddpkit.launch.warm.serverready; "
        "print(before, gc.get_freeze_count(), gc.isenabled())"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    before, after, enabled = done.stdout.split()
    assert after == before and enabled == "True"
