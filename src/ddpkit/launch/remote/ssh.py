"""``ddpkit run --hosts``: one command starts the job on every host over OpenSSH.

ssh runs with the user's keys, config and agent, never asking (``BatchMode``), within a
connect timeout, one session a host (:class:`HostSession`). Before anything starts, every
host answers a probe at once (:func:`preflight`): it takes the key, has the working folder,
the same Python with ddpkit and torch of the same versions, and the script; the first host's
rendezvous port is free and the others reach it. A failure names the host and the fix, and
nothing starts anywhere; else each session is told to go on to ``ddpkit run``.

Then each host's ``ddpkit run`` (what :mod:`ddpkit.launch.remote.entry` becomes) streams its
merged console back, each line labelled with its host. Each remote job watches its standard
input: when the connection ends (this launcher stopped, killed, or the network lost), its
launcher stops its workers. One host failing stops the others; the exit code is the job's.

Example::

    run_on_hosts(plan, Script("train.py"), forwarded_environment([]), Ssh())   # 0: all succeeded
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata

from ddpkit._core.log import command_logger
from ddpkit.errors import ConfigError, StoppedBySignalError
from ddpkit.launch.remote.hostfile import Host
from ddpkit.launch.remote.job import LINK_TIMEOUT_S, RemotePlan, Script
from ddpkit.launch.remote.order import ENTRY, GO, PROBE_ANSWER

CONNECT_TIMEOUT_S = 5
STOP_GRACE_S = 30  # a host's job gets this long to checkpoint and stop before ssh is cut


@dataclass(frozen=True)
class Ssh:
    """How ssh is run: the user's own setup, plus ``config`` (``-F``) when given. The host
    comes after ``--``, so nothing in it is read as an option, and the command is always
    ``PYTHON -m ddpkit.launch.remote.entry``.

    Example:
        >>> Ssh().argv(Host("b"), "/usr/bin/python3")[-5:]
        ['--', 'b', '/usr/bin/python3', '-m', 'ddpkit.launch.remote.entry']
    """

    config: str | None = None

    def argv(self, host: Host, python: str) -> list[str]:
        options = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
        options += ["-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
        config = ["-F", self.config] if self.config else []
        return ["ssh", *config, *options, "--", host.name, python, "-m", ENTRY]


class HostSession:
    """One host's ssh session, the only one: its order goes down the session's stdin, the
    probe answers first, then the host waits for ``go`` before it becomes ``ddpkit run``; its
    console is relayed from then on, each line labelled with the host.

    Example::

        session = HostSession(plan, 0, Script("train.py"), env, Ssh())
        session.answer()   # the probe's findings, as a finished process
    """

    def __init__(
        self, plan: RemotePlan, index: int, script: Script, env: Mapping[str, str], ssh: Ssh
    ) -> None:
        self.host = plan.hosts[index]
        argv = ssh.argv(self.host, plan.python)
        # a session of its own: Ctrl-C reaches this launcher alone, which stops each host
        pipe = subprocess.PIPE
        self.process = subprocess.Popen(argv, stdin=pipe, stdout=pipe, stderr=subprocess.STDOUT,
                                        start_new_session=True)  # fmt: skip
        self._send(plan.order(index, script, env).encode())
        self._said: list[str] = []  # ssh's own lines before the probe's answer
        self._answer: str | None = None
        self._answered = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def answer(self, timeout: float = CONNECT_TIMEOUT_S + 60) -> subprocess.CompletedProcess[str]:
        """The probe's answer (exit code 0), or how the session ended without one."""
        if not self._answered.wait(timeout):
            return subprocess.CompletedProcess([], 124, "", f"no answer within {timeout:.0f} s")
        if self._answer is not None:
            return subprocess.CompletedProcess([], 0, self._answer, "".join(self._said))
        code = self.process.wait(timeout=10)
        return subprocess.CompletedProcess([], code, "", "".join(self._said))

    def go(self) -> None:
        """Start ``ddpkit run`` there."""
        self._send(GO)

    def _send(self, message: bytes) -> None:
        """Down the session's stdin; a session that already ended says why in its answer."""
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.write(message)
            self.process.stdin.flush()

    def _read(self) -> None:
        assert self.process.stdout is not None
        label = f"[{self.host.address}] ".encode()
        for line in self.process.stdout:
            if self._answer is not None:
                with _console:  # whole lines, never cut by another host's
                    sys.stdout.buffer.write(label + line)
                    sys.stdout.buffer.flush()
            elif line.startswith(PROBE_ANSWER.encode()):
                self._answer = line.decode(errors="replace")
                self._answered.set()
            else:
                self._said.append(line.decode(errors="replace"))
        self._answered.set()


_console = threading.Lock()


def preflight(plan: RemotePlan, script: Script, sessions: Sequence[HostSession]) -> None:
    """Every host's answer judged; ConfigError naming each host that is not ready, and why.

    Example::

        preflight(plan, Script("train.py"), sessions)
    """
    found = [_judge(plan, i, script, session.answer()) for i, session in enumerate(sessions)]
    if found[0]:  # the others could not reach a first host that did not listen: not theirs
        found[1:] = [problem for problem in found[1:] if _UNREACHED not in problem]
    problems = [problem for problem in found if problem]
    if problems:
        raise ConfigError("not started on any host:\n" + "\n".join(problems))


def _judge(
    plan: RemotePlan, index: int, script: Script, done: subprocess.CompletedProcess[str]
) -> str:
    host = plan.hosts[index]
    said = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    lines = [x for x in done.stdout.splitlines() if x.startswith(PROBE_ANSWER)]
    if done.returncode == 255 or (not lines and "ssh:" in said) or "Permission denied" in said:
        return (
            f"host {host.name}: ssh cannot log in ({said or 'no reason given'}); check that "
            f"`ssh {host.name} true` works without a password (keys, agent, ~/.ssh/config)"
        )
    if not lines:
        return (
            f"host {host.name}: could not run {plan.python} -m {ENTRY} there ({said}); the "
            "same Python with ddpkit installed must be there (or give --remote-python)"
        )
    found = json.loads(lines[-1].removeprefix(PROBE_ANSWER))
    return _compare(plan, index, found, script)


_UNREACHED = "cannot reach"


def _compare(plan: RemotePlan, index: int, found: Mapping[str, object], script: Script) -> str:
    host, port = plan.hosts[index], plan.port
    here = {"ddpkit": metadata.version("ddpkit"), "torch": metadata.version("torch")}
    if "error" in found:
        return f"host {host.name}: {found['error']} for {plan.python} there (or --remote-python)"
    if not found.get("folder"):
        return (
            f"host {host.name}: the folder {plan.cwd} is not there ({found.get('folder_error')}); "
            "the job runs in the same folder on every host (a shared file system)"
        )
    differ = [f"{k} {found[k]} there, {v} here" for k, v in here.items() if found.get(k) != v]
    if differ:
        return f"host {host.name}: {'; '.join(differ)}: install the same versions on every host"
    if not found["script"]:
        return f"host {host.name}: {script.missing()}"
    if index == 0 and not found.get("port_free"):
        return f"host {host.name}: port {port} is in use there; give another with --master-port"
    if index > 0 and not found.get("reaches_first"):
        return (
            f"host {host.name}: {_UNREACHED} {plan.meeting_point}, where the nodes meet, within "
            f"{LINK_TIMEOUT_S} s (a firewall, or {plan.first} names another address there)"
        )
    return ""


def run_on_hosts(plan: RemotePlan, script: Script, env: Mapping[str, str], ssh: Ssh) -> int:
    """Check every host and, if all are ready, start the job on each, in one ssh session a
    host; relay their consoles; stop them all when one fails (under ``--nnodes MIN:MAX``,
    when fewer than MIN go on) or this launcher is stopped. The job's exit code.

    Example::

        code = run_on_hosts(plan, Script("train.py"), forwarded_environment([]), Ssh())
    """
    sessions = [HostSession(plan, i, script, env, ssh) for i in range(len(plan.hosts))]
    jobs = [session.process for session in sessions]
    try:
        with _stopped_by_signals():
            preflight(plan, script, sessions)  # nothing runs anywhere until all are ready
            command_logger("run").info(
                f"{len(plan.hosts)} host(s) over ssh: {', '.join(map(str, plan.hosts))}; "
                f"nodes meet at {plan.meeting_point}"
            )
            for session in sessions:
                session.go()
            return _wait(plan, jobs)
    finally:
        _stop(jobs)


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """Ctrl-C, SIGTERM or SIGUSR1 here stop the job on every host (each checkpoints first),
    then end this launcher as ``ddpkit run`` ends on one node: StoppedBySignalError."""

    def stop(signum: int, _frame: object) -> None:
        raise StoppedBySignalError(signal.Signals(signum).name, signum)

    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    previous = {sig: signal.signal(sig, stop) for sig in stops}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait(plan: RemotePlan, jobs: Sequence[subprocess.Popen[bytes]]) -> int:
    """Until every host's job ended; the first failure's code, or 0. A host that fails ends
    the job, unless an elastic job keeps its minimum of nodes without it."""
    say, left = command_logger("run"), set[int]()
    while True:
        codes = [job.poll() for job in jobs]
        for index, code in enumerate(codes):
            if code not in (None, 0) and index not in left:
                left.add(index)
                if not _goes_on(plan, codes):
                    say.error(f"host {plan.hosts[index].name} failed (exit code {code}); "
                              "stopping the other hosts")  # fmt: skip
                    return int(code or 1)
                say.warning(f"host {plan.hosts[index].name} left (exit code {code}); the "
                            "others go on without it")  # fmt: skip
        if all(code is not None for code in codes):
            return next((int(c) for c in codes if c), 0) if len(left) == len(jobs) else 0
        time.sleep(0.1)


def _goes_on(plan: RemotePlan, codes: Sequence[int | None]) -> bool:
    """Whether enough hosts still run (or finished well) for the job to go on."""
    least = plan.min_nodes()
    return least < len(plan.hosts) and sum(code in (None, 0) for code in codes) >= least


def _stop(jobs: Sequence[subprocess.Popen[bytes]]) -> None:
    """End every host's job: close its stdin (its launcher stops its workers), then wait."""
    for job in jobs:
        if job.poll() is None and job.stdin is not None:
            job.stdin.close()
    deadline = time.monotonic() + STOP_GRACE_S
    for job in jobs:
        try:
            job.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()
