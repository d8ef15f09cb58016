"""Child jobs that ddpkit's own commands start: a script, or ``ddpkit run`` of one.

``ddpkit verify`` and ``ddpkit doctor`` run the user's script as a child and must never
hang with it: each child gets its own session, so on a timeout (or Ctrl-C) the whole tree,
launcher and workers, is stopped together, and what it printed comes back for the report.

Example:
    >>> ddpkit_run_command(2, "train.py", ["--lr", "0.1"])[1:]
    ['-m', 'ddpkit', 'run', '--nproc', '2', 'train.py', '--lr', '0.1']
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

_STOP_GRACE_S = 5.0
_TAIL_LINES = 15
_VERDICT_LINES = 30
_HAS_PROCESS_GROUPS = hasattr(os, "killpg")


def ddpkit_run_command(nproc: int, script: str, args: list[str], *, restarts: int = 0) -> list[str]:
    """The command line of ``ddpkit run --nproc N SCRIPT ARGS`` with this Python
    (``restarts``: ``--max-restarts``, torch's agent restarting the workers that often).

    Example:
        >>> ddpkit_run_command(1, "t.py", [])[-3:]
        ['--nproc', '1', 't.py']
        >>> ddpkit_run_command(1, "t.py", [], restarts=1)[-5:-1]
        ['--nproc', '1', '--max-restarts', '1']
    """
    again = ["--max-restarts", str(restarts)] if restarts else []
    return [sys.executable, "-m", "ddpkit", "run", "--nproc", str(nproc), *again, script, *args]


@dataclass(frozen=True)
class Outcome:
    """How a launched command ended: exit code (None when it timed out) and its output.

    Example:
        >>> Outcome(None, "...", 35.2, limit_s=30).failure("smoke test")
        'smoke test did not finish within 30 s; its output ends with:\\n...'
    """

    returncode: int | None
    output: str
    seconds: float
    limit_s: float | None = None

    def failure(self, what: str) -> str | None:
        """Why the command failed (with its output's tail), or None when it succeeded."""
        if self.returncode == 0:
            return None
        how = (
            f"did not finish within {self.limit_s or self.seconds:g} s"
            if self.returncode is None
            else f"exited with code {self.returncode}"
        )
        return f"{what} {how}; its output ends with:\n{error_text(self.output)}"


def error_text(output: str) -> str:
    """The launcher's own verdict (``ddpkit run: worker rank 1 failed ...``), else the tail.

    Example:
        >>> error_text("ddpkit run: 2 worker(s) on this node\\nnoise\\nddpkit run: worker 1 failed")
        'ddpkit run: worker 1 failed'
    """
    lines = output.strip().splitlines()
    verdicts = [
        i
        for i, line in enumerate(lines)
        if line.startswith("ddpkit run:") and "on this node" not in line  # not the start line
    ]
    if verdicts:
        return "\n".join(lines[verdicts[-1] :][:_VERDICT_LINES])
    return "\n".join(lines[-_TAIL_LINES:])


def run_command(command: list[str], env: dict[str, str], timeout: float) -> Outcome:
    """Run ``command`` with ``env`` added to ours; stop its whole tree at ``timeout``.

    Example:
        >>> run_command([sys.executable, "-c", "print('hi')"], {}, 30).output
        'hi\\n'
    """
    start = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        env={**os.environ, **env}, start_new_session=_HAS_PROCESS_GROUPS,
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(process)
        output, _ = process.communicate()
        return Outcome(None, output, time.perf_counter() - start, limit_s=timeout)
    except BaseException:  # Ctrl-C: the launcher runs in its own session and would not see it
        _stop(process)
        raise
    return Outcome(process.returncode, output, time.perf_counter() - start)


def _stop(process: subprocess.Popen[str]) -> None:
    """Stop the launcher and its workers: SIGTERM to the session's group, SIGKILL if it stays."""
    if not _HAS_PROCESS_GROUPS:  # Windows: the launcher alone; its agent stops workers
        process.terminate()
        _wait_or_kill(process)
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        if _group_gone(process, _STOP_GRACE_S):
            return


def _group_gone(process: subprocess.Popen[str], grace_s: float) -> bool:
    """Whether the whole group ended within ``grace_s``: the launcher first, then its workers.

    The launcher can exit while a worker is still running its SIGTERM handler, and that worker,
    now an orphan, would outlive the job if we stopped at the launcher.
    """
    deadline = time.monotonic() + grace_s
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        return False
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _wait_or_kill(process: subprocess.Popen[str]) -> None:
    try:
        process.wait(_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
