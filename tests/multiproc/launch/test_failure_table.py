"""The failure table (docs/diagnostics.md#what-a-failure-looks-like), end to end through
``ddpkit run --nproc 2``: each way a job fails ends with the right exit code, the rank to
blame and its true cause on the first line, and one traceback, with the user's frames only.
The hang rows (a rank stuck in a collective, one that never reaches prepare_model, a step
that stalls) and the mismatched collective are in tests/multiproc/runtime/test_hangs.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launch_helpers import SCRIPTS, ddpkit_cli, processes_running

pytestmark = pytest.mark.multiproc

SCRIPT = SCRIPTS / "fail_as.py"
AT = re.escape(str(SCRIPT))

# mode: (exit code, the summary's first line, another line that must be shown)
TABLE = {
    "one_rank": (1, r"worker rank 1 failed \(exit code 1\)",
                 r"ValueError: bad batch on rank 1\n.*rank 0: (failed when a peer left|stopped)"),
    "every_rank": (1, r"ranks 0,1 failed with the same error \(exit code 1\)",
                   r"ValueError: learning rate must be positive \(got -0.1\)"),
    "import": (1, r"ranks 0,1 failed with the same error \(exit code 1\)",
               r"line 18, in <module>\n.*\n.*\nModuleNotFoundError: No module named "
               r"'tokenizers_that_are_not_installed'"),
    "sys_exit": (3, r"worker rank 1 failed \(exit code 3\)",
                 rf"the script called sys.exit\(3\) at {AT}:\d+"),
    "os_exit": (3, r"worker rank 1 failed \(exit code 3\)",
                r"no Python error was recorded \(os._exit, or a crash in native code\)"),
    "sigkill": (137, r"worker rank 1 failed \(killed by signal 9\)",
                r"Signal 9 \(SIGKILL\) received by PID \d+ \(SIGKILL comes from `kill -9` or the "
                r"kernel's OOM killer"),
    "finished": (1, rf"rank 0 waited in all_reduce_sum \({AT}:\d+\) but rank 1 finished the "
                 r"script without calling it: every rank must make the same collective calls "
                 r"in the same order \(evaluating or saving on rank 0 only\?",
                 r"ddpkit.all_reduce_sum\(1.0\)  # rank 0 waits here"),
    "nan": (1, r"worker rank 1 failed \(exit code 1\)",
            r"NonFiniteLossError: loss is nan on rank 1 at step 3 \(epoch 1\)"),
    "too_few_samples": (1, r"ranks 0,1 failed with the same error \(exit code 1\)",
                        r"ConfigError: the dataset has 1 sample\(s\) but the job has 2 ranks: "
                        r"every rank needs at least one; launch --nproc 1 or fewer"),
}  # fmt: skip


@pytest.mark.parametrize("mode", list(TABLE))
def test_each_failure_names_its_true_cause_once(mode: str) -> None:
    code, first_line, shown = TABLE[mode]
    done = ddpkit_cli("run", "--nproc", "2", str(SCRIPT), mode)
    assert done.returncode == code, done.stderr
    summary = done.stderr[done.stderr.index("ddpkit run: ", 1) :]  # after the start-up line
    assert re.match(rf"ddpkit run: {first_line}", summary), done.stderr
    assert re.search(shown, summary), done.stderr
    assert done.stderr.count("Traceback (most recent call last)") <= 1, done.stderr
    assert "worker.py" not in done.stderr and "runpy" not in done.stderr  # the user's frames
    assert "local_rank: " not in done.stderr  # torch's own "failed (exitcode: 1)" lines
    assert processes_running(f"{SCRIPT} {mode}") == []


def write_syntax_error(folder: Path) -> Path:
    script = folder / "train.py"
    script.write_text("import ddpkit\n\nddpkit.init()\nfor x in range(3) print(x)\n")
    return script


def test_a_syntax_error_is_one_message_and_no_worker_starts(tmp_path: Path) -> None:
    script = write_syntax_error(tmp_path)
    done = ddpkit_cli("run", "--nproc", "2", str(script))
    assert done.returncode == 1
    assert done.stderr == (
        f"ddpkit run: {script} cannot run, so no worker was started:\n"
        f'  File "{script}", line 4\n'
        "    for x in range(3) print(x)\n"
        "                      ^^^^^\n"
        "SyntaxError: invalid syntax\n"
    )  # fmt: skip
    assert done.stdout == ""  # not even the start-up line: nothing was launched


def test_a_module_that_does_not_compile_is_caught_the_same_way(tmp_path: Path) -> None:
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write_syntax_error(package)
    done = subprocess.run(
        [sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "-m", "mypkg.train"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "mypkg/train.py cannot run, so no worker was started" in done.stderr
    assert "SyntaxError: invalid syntax" in done.stderr and "Traceback" not in done.stderr


def test_a_rank_gone_without_a_record_is_blamed_when_its_peer_failed_before_the_check() -> None:
    """Warm workers are torch's function workers, whose context reported one failed worker:
    the first in rank order among those ended at its check. With the agent checking every
    3 s, rank 1's os._exit(3) and rank 0's failure on the lost peer have both happened by
    then: rank 0 alone was reported, and blamed as a rank that waited for one that had
    "finished the script". Every ended worker is reported now, and rank 1 is the cause."""
    done = ddpkit_cli("run", "--nproc", "2", "--monitor-interval", "3", str(SCRIPT), "os_exit")
    assert done.returncode == 3, done.stderr
    summary = done.stderr[done.stderr.index("ddpkit run: ", 1) :]
    assert summary.startswith("ddpkit run: worker rank 1 failed (exit code 3)"), done.stderr
    assert "finished the script" not in summary, done.stderr
