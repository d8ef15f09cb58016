"""``ddpkit run --run-path``: the script runs in workers torch's launcher starts from a
function, by ``--start-method`` (spawn as torchrun, or forked from a warm forkserver). Every
way a script ends must end the job as it does as ``python script.py``; none may leave the
agent waiting for a result that never comes."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys

import pytest

from helpers.jobs import children, wait_until
from helpers.launch_helpers import REPO, SCRIPTS, ddpkit_cli

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(170)]

SCRIPT = str(SCRIPTS / "run_path_endings.py")
METHODS = ["spawn", "forkserver"]


def run(mode: str, method: str, stdin: str | None = None) -> tuple[int, str]:
    done = ddpkit_cli("run", "--nproc", "2", "--run-path", "--start-method", method, SCRIPT,
                      mode, timeout=150, input=stdin)  # fmt: skip
    return done.returncode, done.stdout + done.stderr


# Every ending under warm workers (the default); under spawn, one of each way out (a
# return, os._exit, a caught Ctrl-C): the endings are told apart by the same worker code
# whatever started the process, and a spawned pair costs twice a forked one's CPU.
ENDINGS = ["return", "sys_exit", "sys_exit0", "os_exit0", "os_exit0_thread", "caught_sigint"]


@pytest.mark.parametrize(
    ("mode", "method"),
    [(mode, "forkserver") for mode in ENDINGS]
    + [(mode, "spawn") for mode in ("return", "os_exit0", "caught_sigint")],
)
def test_a_script_that_succeeds_ends_the_job_with_0(mode: str, method: str) -> None:
    code, out = run(mode, method)
    assert code == 0, out
    if mode == "caught_sigint":
        assert out.count("caught KeyboardInterrupt") == 2, out
    if mode.startswith("os_exit0"):
        assert out.count("leaving by os._exit(0)") == 2 and "main thread woke" not in out, out


@pytest.mark.parametrize("method", METHODS)
def test_ddpkits_step_limit_stop_ends_the_job_with_0(method: str, monkeypatch) -> None:
    monkeypatch.setenv("DDPKIT_MAX_STEPS", "3")
    code, out = run("step_limit", method)
    assert code == 0 and "stopped after 3 optimizer steps" in out, out
    assert "after the loop: never" not in out


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("mode", "said"), [
    ("sys_exit3", "the script called sys.exit(3) at "),
    ("raise", "ValueError: a bad batch on rank 1"),
])  # fmt: skip
def test_a_failing_script_fails_the_job_naming_the_rank(mode: str, said: str, method: str) -> None:
    code, out = run(mode, method)
    assert code != 0 and said in out and "worker rank 1" in out, out


@pytest.mark.parametrize("method", METHODS)
def test_a_worker_has_what_a_fresh_interpreter_has(method: str, monkeypatch) -> None:
    # Not ddpkit's default for 2 workers on 2 cores (1): the user's value must reach torch.
    # (A warm server's torch reading one launch's value and a later launch's another:
    # test_warm_spawn.py, where two launches share a server.)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    code, out = run("state", method)
    assert code == 0, out
    states = dict(re.findall(r"state rank=(\d) (.+)", out))
    assert set(states) == {"0", "1"}, out
    draws = set()
    for state in states.values():
        fields = dict(part.split("=", 1) for part in state.split(" "))
        assert fields["threads"] == "3" and fields["main"] == "__main__", state
        assert fields["mp"] == "fork", state  # the script's own pools: the platform default
        assert fields["session"] == "True", state  # a terminal's Ctrl-C reaches the launcher
        assert fields["argv"] == "['state']", state
        draws.add(fields["numpy"])
    assert len(draws) == 2, f"NumPy drew the same on every rank: {states}"
    # ps shows the script, not the server or spawn's stub: pkill -f, monitoring, the tests'
    # own helpers find a rank by it (the rank named, as a fork's environment cannot show it)
    cmdlines = dict(re.findall(r"cmdline rank=(\d): (.+)", out))
    for rank, cmdline in cmdlines.items():
        assert cmdline.endswith(f"-u {SCRIPT} state  (ddpkit rank {rank})"), cmdline
    assert set(cmdlines) == {"0", "1"}, out
    if method == "forkserver":
        assert "workers forked from a server that imported torch once" in out


def test_ddpkit_run_forks_warm_workers_unless_asked_for_fresh_ones() -> None:
    """Warm workers are the default (issue 67): a plain ``ddpkit run`` line forks its
    workers from the server, and they look like fresh interpreters (as above)."""
    done = ddpkit_cli("run", "--nproc", "2", SCRIPT, "state", timeout=150)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "workers forked from a server that imported torch once" in out, out
    for rank in (0, 1):
        assert re.search(rf"cmdline rank={rank}: .+ \(ddpkit rank {rank}\)$", out, re.M), out


def test_a_fresh_worker_shows_its_own_command_line_and_environment() -> None:
    """With --fresh-workers nothing renames a worker: its command line is its interpreter's,
    and its rank stays readable in /proc/PID/environ (setproctitle's set-up overwrites it)."""
    done = ddpkit_cli("run", "--nproc", "2", "--fresh-workers", SCRIPT, "state", timeout=150)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    for rank in (0, 1):
        assert f"[rank{rank}] environ rank={rank}: True" in out, out
        assert re.search(
            rf"cmdline rank={rank}: \S+ -u -m ddpkit.launch.worker \S+ state$", out, re.M
        )


@pytest.mark.parametrize("method", METHODS)
def test_threads_pools_and_exit_handlers_finish_as_after_a_fresh_interpreter(method: str) -> None:
    code, out = run("exit_handlers", method)
    assert code == 0, out
    for rank in (0, 1):
        said = [f"[rank{rank}] {what} done on rank {rank}" for what in ("thread", "pool task")]
        handler = f"[rank{rank}] atexit handler on rank {rank}"  # in the rank's own output
        assert all(line in out for line in [*said, handler]), out
        assert max(out.index(line) for line in said) < out.index(handler), out


def test_a_forked_worker_reads_the_launchers_stdin() -> None:
    """A warm worker has ``ddpkit run``'s stdin (``input()``, ``breakpoint()``), as a fresh
    ``python`` does; Python's forkserver closes it (a spawned function worker keeps
    /dev/null there, as under torchrun --run-path)."""
    code, out = run("stdin", "forkserver", stdin="the first line\nthe second\n")
    assert code == 0 and "[rank0] read from stdin: 'the first line'" in out, out


@pytest.mark.parametrize("method", METHODS)
def test_the_scripts_own_forked_processes_end_as_theirs(method: str) -> None:
    """DataLoader workers forked by the script end by ``os._exit(0)``: theirs, not the
    worker's ending (which returns to torch's agent), or they would run on as the rank."""
    code, out = run("dataloader", method)
    assert code == 0 and "can only test a child process" not in out, out
    assert all(f"[rank{r}] rank {r} loaded 4 batches" in out for r in (0, 1)), out


@pytest.mark.parametrize("method", ["fresh", *METHODS])
def test_a_stopped_workers_own_children_are_stopped_with_it(method: str, tmp_path) -> None:
    """torch's agent signals a fresh worker's whole process group, and a function worker
    alone: the worker relays the signal to what the script started (here a child process
    of rank 0, which torch stops when rank 1 fails), else it would run on."""
    report = tmp_path / "child.txt"
    warm = ["--fresh-workers"] if method == "fresh" else ["--run-path", "--start-method", method]
    done = ddpkit_cli("run", "--nproc", "2", *warm, SCRIPT, "child_stop", str(report),
                      timeout=150)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "rank 1 fails" in out, out
    assert report.read_text().splitlines() == ["child started", "child stopped by SIGTERM"], out


# Every forwarded signal, on warm workers (a spawned function worker runs the same relay);
# two of them (SIGHUP, SIGQUIT) have the kernel's default action, which no Python handler sees.
@pytest.mark.parametrize("method", ["forkserver"])
@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1"])
def test_every_signal_that_stops_the_launcher_reaches_a_workers_children(
    stop: str, method: str, tmp_path
) -> None:
    """Each signal torch's agent passes on (docs/torchrun.md: SLURM's SIGUSR1 warning among
    them) reaches what a function worker's script started, as killpg reaches a fresh
    worker's: the child of rank 0 says which signal stopped it."""
    report, log = tmp_path / "child.txt", tmp_path / "job.log"
    with log.open("w") as out:
        job = subprocess.Popen(
            [sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "--run-path",
             "--start-method", method, SCRIPT, "child_waits", str(report)],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        started = lambda: report.exists() and "child started" in report.read_text()  # noqa: E731
        wait_until(lambda: started() or job.poll() is not None, 120, "rank 0's child")
        assert started(), log.read_text()
        job.send_signal(getattr(signal, stop))
        job.wait(timeout=60)
    finally:
        job.kill()
    wait_until(lambda: len(report.read_text().splitlines()) == 2, 20, f"the child's {stop}")
    said = report.read_text().splitlines()
    assert said == ["child started", f"child stopped by {stop}"], log.read_text()


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGUSR1"])
def test_a_stop_sent_to_every_process_of_the_job_still_checkpoints(stop: str, tmp_path) -> None:
    """SLURM's scancel signals every process of the job step, the warm server among them:
    it must outlive the signal, or torch's agent reads every worker as failed (exit 255)
    before any can checkpoint (found when warm workers became the default, issue 67)."""
    log = tmp_path / "job.log"
    with log.open("w") as out:
        job = subprocess.Popen(
            [sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "examples/wine.py",
             "--epochs", "500", "--checkpoint-dir", str(tmp_path / "ck")],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_until(lambda: "epoch 3/" in log.read_text() or job.poll() is not None, 120,
                   "epoch 3")  # fmt: skip
        everyone, parents = [job.pid], [job.pid]
        while parents:  # the launcher, the warm server, the workers: as SLURM finds them
            below = children(parents.pop())
            everyone += below
            parents += below
        for pid in everyone:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, getattr(signal, stop))
        assert job.wait(timeout=90) == 75, log.read_text()
    finally:
        job.kill()
    said = log.read_text()
    assert f"workers stopped by {stop} at " in said and "after saving" in said, said
    assert "Traceback" not in said, said  # Python's resource tracker lived on too
