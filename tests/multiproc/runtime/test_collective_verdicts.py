"""Hangs and failures inside the collectives, named at the collective: rank, op, group,
sequence number, size and source line, from every rank's Flight Recorder (torch's, armed by
ddpkit in every worker), within the hang timeout + 10 s, and nothing left running."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import pytest

from ddpkit._core.torchversion import torch_at_least
from helpers.launch_helpers import REPO, SCRIPTS, processes_running

pytestmark = [pytest.mark.multiproc, pytest.mark.serial]  # timed: runs alone (make test)

HANG_TIMEOUT_S = 5
SCRIPT = SCRIPTS / "collective_trouble.py"


def trouble(mode: str, strategy: str = "ddp") -> tuple[int, str, float]:
    """Exit code, the launcher's report (after the blamed rank's line), and the seconds from
    the first training step to the moment a rank printed the collectives' verdict."""
    command = [sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "--hang-timeout",
               str(HANG_TIMEOUT_S), str(SCRIPT), mode, strategy]  # fmt: skip
    job = subprocess.Popen(command, cwd=REPO, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)  # fmt: skip
    seen: dict[str, float] = {}
    reader = threading.Thread(target=_watch_stdout, args=(job, seen))
    reader.start()
    try:
        err = job.stderr.read() if job.stderr else ""
        job.wait(timeout=180)
    finally:
        job.kill()
        reader.join(timeout=10)
    assert processes_running(f"{SCRIPT} {mode} {strategy}") == []
    named = seen.get("named", time.monotonic()) - seen.get("training", 0.0)
    return job.returncode, err.split("ddpkit run: worker rank")[-1], named


def _watch_stdout(job: subprocess.Popen[str], seen: dict[str, float]) -> None:
    assert job.stdout is not None
    for line in job.stdout:
        if "world size 2" in line:
            seen.setdefault("training", time.monotonic())
        if "ddpkit: hang:" in line or "collectives:" in line:
            seen.setdefault("named", time.monotonic())


def collectives_line(report: str) -> str:
    found = re.search(r"^collectives: (.+)$", report, re.MULTILINE)
    assert found, report
    return found[1]


@pytest.mark.oldest_torch  # where gloo's collectives are not recorded, it says so once
def test_a_collective_on_rank_0_only_names_the_rank_that_never_issued_it() -> None:
    code, report, named_after = trouble("rank0_only")
    assert code == 124 and named_after <= HANG_TIMEOUT_S + 10, report
    if not torch_at_least("2.8"):
        assert report.count("collectives: not named: torch 2.7 records no gloo") == 1, report
        assert "hang: rank 0 waited" in report  # the activities' report, as before
        return
    line = collectives_line(report)
    assert re.match(
        r"rank 1 never issued all_reduce #(\d+) of the default group \(3 float32\); rank 0 "
        r"waits in it since \d+ s, called from collective_trouble\.py:\d+ \(main\); rank 1's "
        r"last collective there was #(\d+) at collective_trouble\.py:\d+ \(main\)",
        line,
    ), line
    waited, last = map(int, re.findall(r"#(\d+)", line))
    assert last == waited - 1
    assert "fix: the missing rank is elsewhere" in report


# One strategy only: the stopped rank ignores SIGTERM, so each run lasts torch's 30 s until
# its SIGKILL. DDP's gradient bucket is named by the skip_backward case below.
@pytest.mark.parametrize(
    ("strategy", "waited_in"),
    [("fsdp", r"all_gather #\d+ of the default group \(FSDP all-gather, 55 float32\)")],
)
def test_a_rank_stopped_mid_step_is_named_and_the_waiting_ranks_collective_shown(
    strategy: str, waited_in: str
) -> None:
    code, report, named_after = trouble("sigstop", strategy)
    # named in time; the stopped rank ignores SIGTERM, so the job ends with torch's SIGKILL
    assert code == 124 and named_after <= HANG_TIMEOUT_S + 10, report
    line = collectives_line(report)
    assert re.match(
        rf"rank 0 waits in {waited_in} since \d+ s, called from collective_trouble\.py:\d+ "
        r"\(main\); rank 1 did not answer",
        line,
    ), line


@pytest.mark.parametrize(
    ("mode", "waiting", "aborted", "what"),
    [("sizes", 1, 0, r"9 float32"), ("skip_backward", 0, 1, r"DDP gradient bucket, 110 float32")],
)
def test_ranks_that_disagree_on_a_collective_are_named_with_the_size_and_line(
    mode: str, waiting: int, aborted: int, what: str
) -> None:
    # gloo aborts the rank that receives another size than it expects: the other rank's
    # Flight Recorder, in its error file, still names the collective and its line.
    code, report, _ = trouble(mode)
    assert code == 128 + 6, report  # SIGABRT
    line = collectives_line(report)
    assert re.match(
        rf"rank {waiting} was in all_reduce #\d+ of the default group \({what}\), called from "
        rf"collective_trouble\.py:\d+ \(main\); rank {aborted} aborted \(SIGABRT\)",
        line,
    ), line
    assert "fix: every rank must issue the same collectives" in report
