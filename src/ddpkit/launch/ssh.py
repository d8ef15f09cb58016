"""``ddpkit run --hosts``: one command starts the job on every host over OpenSSH.

ssh runs with the user's keys, config and agent, never asking (``BatchMode``), within a
connect timeout. Before anything starts, every host is checked at once (:func:`preflight`):
it answers and takes the key, has the working folder, the same Python with ddpkit and torch
of the same versions, and the script; the first host's rendezvous port is free. A failure
names the host and the fix, and nothing starts anywhere.

Then each host's ``ddpkit run`` (:mod:`ddpkit.launch.remote`) streams its merged console
back, each line labelled with its host. Each remote job watches its standard input: when the
connection ends (this launcher stopped, killed, or the network lost), its launcher stops its
workers. One host failing stops the others; the exit code is the job's.

Example::

    run_on_hosts(plan, forwarded_environment([]))   # 0 when every host's job succeeded
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata

from ddpkit._core.log import command_logger
from ddpkit.env.hostfile import Host
from ddpkit.errors import ConfigError, StoppedBySignalError
from ddpkit.launch.remote import RemotePlan

CONNECT_TIMEOUT_S = 5
STOP_GRACE_S = 30  # a host's job gets this long to checkpoint and stop before ssh is cut

# Run on each host by preflight (argv: script, port, peers, first host or "-", seconds): the
# installed versions, whether the script is there, and the link: the first host listens on
# the rendezvous port until every other host has connected to it (as doctor --nodes checks).
_PROBE = """
import json, os, socket, sys, time
from importlib.metadata import PackageNotFoundError, version
script, port, peers, first, link = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:]
try:  # the installed versions, without importing torch (seconds)
    found = {"ddpkit": version("ddpkit"), "torch": version("torch")}
except PackageNotFoundError as err:
    found = {"error": f"{err} is not installed"}
found["script"] = os.path.exists(script)
deadline = time.monotonic() + float(link)
if first == "-":
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store binds
        try:
            s.bind(("", port)); s.listen(); found["port_free"] = True
        except OSError:
            found["port_free"] = False
        while found["port_free"] and peers and time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                s.accept()[0].close(); peers -= 1
            except OSError:
                break
else:
    found["reaches_first"] = False
    while time.monotonic() < deadline and not found["reaches_first"]:
        try:
            socket.create_connection((first, port), 1).close(); found["reaches_first"] = True
        except OSError:
            time.sleep(0.1)
print("ddpkit-probe " + json.dumps(found))
"""
LINK_TIMEOUT_S = 5  # how long the other hosts try to reach the first one's port


@dataclass(frozen=True)
class Ssh:
    """How ssh is run: the user's own setup, plus ``config`` (``-F``) when given.

    Example:
        >>> Ssh().argv(Host("b"), "true")[:3]
        ['ssh', '-o', 'BatchMode=yes']
    """

    config: str | None = None

    def argv(self, host: Host, command: str) -> list[str]:
        options = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
        options += ["-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
        config = ["-F", self.config] if self.config else []
        return ["ssh", *config, *options, host.name, command]


def preflight(plan: RemotePlan, script: str, ssh: Ssh) -> None:
    """Check every host at once; ConfigError naming each host that is not ready, and why.

    Example::

        preflight(plan, "train.py", Ssh())
    """
    with concurrent.futures.ThreadPoolExecutor(len(plan.hosts)) as pool:
        found = list(pool.map(lambda i: _check_host(plan, i, script, ssh), range(len(plan.hosts))))
    if found[0]:  # the others could not reach a first host that did not listen: not theirs
        found[1:] = [problem for problem in found[1:] if _UNREACHED not in problem]
    problems = [problem for problem in found if problem]
    if problems:
        raise ConfigError("not started on any host:\n" + "\n".join(problems))


def _check_host(plan: RemotePlan, index: int, script: str, ssh: Ssh) -> str:
    host = plan.hosts[index]
    python, folder = shlex.quote(plan.python), shlex.quote(plan.cwd)
    link = [str(len(plan.hosts) - 1), "-"] if index == 0 else ["0", plan.first]
    words = " ".join(shlex.quote(w) for w in [script, str(plan.port), *link, str(LINK_TIMEOUT_S)])
    argv = ssh.argv(host, f"cd {folder} && exec {python} -c {shlex.quote(_PROBE)} {words}")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CONNECT_TIMEOUT_S + 60,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"host {host.name}: no answer within {CONNECT_TIMEOUT_S + 60} s"
    return _judge(plan, index, script, done)


def _judge(
    plan: RemotePlan, index: int, script: str, done: subprocess.CompletedProcess[str]
) -> str:
    host = plan.hosts[index]
    said = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    lines = [x for x in done.stdout.splitlines() if x.startswith("ddpkit-probe ")]
    if done.returncode == 255 or (not lines and "ssh:" in said) or "Permission denied" in said:
        return (
            f"host {host.name}: ssh cannot log in ({said or 'no reason given'}); check that "
            f"`ssh {host.name} true` works without a password (keys, agent, ~/.ssh/config)"
        )
    if not lines:
        return (
            f"host {host.name}: could not run {plan.python} in {plan.cwd} ({said}); the same "
            "folder and Python must exist there (a shared file system, or --remote-python)"
        )
    found = json.loads(lines[-1].removeprefix("ddpkit-probe "))
    return _compare(plan, index, found, script)


_UNREACHED = "cannot reach"


def _compare(plan: RemotePlan, index: int, found: Mapping[str, object], script: str) -> str:
    host, port = plan.hosts[index], plan.port
    here = {"ddpkit": metadata.version("ddpkit"), "torch": metadata.version("torch")}
    if "error" in found:
        return f"host {host.name}: {found['error']} for {plan.python} there (or --remote-python)"
    differ = [f"{k} {found[k]} there, {v} here" for k, v in here.items() if found.get(k) != v]
    if differ:
        return f"host {host.name}: {'; '.join(differ)}: install the same versions on every host"
    if not found["script"]:
        return f"host {host.name}: {script} does not exist there (in the same folder)"
    if index == 0 and not found.get("port_free"):
        return f"host {host.name}: port {port} is in use there; give another with --master-port"
    if index > 0 and not found.get("reaches_first"):
        return (
            f"host {host.name}: {_UNREACHED} {plan.first}:{port}, where the nodes meet, within "
            f"{LINK_TIMEOUT_S} s (a firewall, or {plan.first} names another address there)"
        )
    return ""


def run_on_hosts(plan: RemotePlan, env: Mapping[str, str], ssh: Ssh) -> int:
    """Start the job on every host, relay their consoles, stop them all when one fails (under
    ``--nnodes MIN:MAX``, when fewer than MIN go on) or this launcher is stopped; the job's
    exit code.

    Example::

        code = run_on_hosts(plan, forwarded_environment([]), Ssh())
    """
    command_logger("run").info(
        f"{len(plan.hosts)} host(s) over ssh: {', '.join(map(str, plan.hosts))}; nodes meet "
        f"at {plan.first}:{plan.port}"
    )
    jobs = [_start(plan, i, env, ssh) for i in range(len(plan.hosts))]
    try:
        with _stopped_by_signals():
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


def _start(
    plan: RemotePlan, index: int, env: Mapping[str, str], ssh: Ssh
) -> subprocess.Popen[bytes]:
    argv = ssh.argv(plan.hosts[index], plan.command(index, env))
    # a session of its own: Ctrl-C reaches this launcher alone, which stops each host in turn
    job = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    label = f"[{plan.hosts[index].address}] ".encode()
    threading.Thread(target=_relay, args=(job, label), daemon=True).start()
    return job


_console = threading.Lock()


def _relay(job: subprocess.Popen[bytes], label: bytes) -> None:
    """Each line of a host's console, labelled, whole (never cut by another host's)."""
    assert job.stdout is not None
    for line in job.stdout:
        with _console:
            sys.stdout.buffer.write(label + line)
            sys.stdout.buffer.flush()


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
