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
import json
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata

from ddpkit._core.log import command_logger
from ddpkit.env.hostfile import Host
from ddpkit.errors import ConfigError
from ddpkit.launch.remote import RemotePlan

CONNECT_TIMEOUT_S = 5
STOP_GRACE_S = 30  # a host's job gets this long to checkpoint and stop before ssh is cut

# Run on each host by preflight: versions, and whether the script is there and the port free.
_PROBE = """
import json, os, socket, sys
from importlib.metadata import PackageNotFoundError, version
try:  # the installed versions, without importing torch (seconds)
    found = {"ddpkit": version("ddpkit"), "torch": version("torch")}
except PackageNotFoundError as err:
    found = {"error": f"{err} is not installed"}
found["script"] = os.path.exists(sys.argv[1])
if sys.argv[2] != "0":
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store binds
        try:
            s.bind(("", int(sys.argv[2]))); found["port_free"] = True
        except OSError:
            found["port_free"] = False
print("ddpkit-probe " + json.dumps(found))
"""


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
        problems = list(
            pool.map(lambda i: _check_host(plan, i, script, ssh), range(len(plan.hosts)))
        )
    found = [problem for problem in problems if problem]
    if found:
        raise ConfigError("not started on any host:\n" + "\n".join(found))


def _check_host(plan: RemotePlan, index: int, script: str, ssh: Ssh) -> str:
    host = plan.hosts[index]
    port = plan.port if index == 0 else 0
    probe = (
        f"cd {shlex.quote(plan.cwd)} && exec {shlex.quote(plan.python)} -c {shlex.quote(_PROBE)}"
    )
    argv = ssh.argv(host, f"{probe} {shlex.quote(script)} {port}")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CONNECT_TIMEOUT_S + 60,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"host {host.name}: no answer within {CONNECT_TIMEOUT_S + 60} s"
    return _judge(plan, host, script, port, done)


def _judge(
    plan: RemotePlan, host: Host, script: str, port: int, done: subprocess.CompletedProcess[str]
) -> str:
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
    return _compare(host, found, script, port, plan.python)


def _compare(host: Host, found: Mapping[str, object], script: str, port: int, python: str) -> str:
    here = {"ddpkit": metadata.version("ddpkit"), "torch": metadata.version("torch")}
    if "error" in found:
        return f"host {host.name}: {found['error']} for {python} there (or give --remote-python)"
    differ = [f"{k} {found[k]} there, {v} here" for k, v in here.items() if found.get(k) != v]
    if differ:
        return f"host {host.name}: {'; '.join(differ)}: install the same versions on every host"
    if not found["script"]:
        return f"host {host.name}: {script} does not exist there (in the same folder)"
    if port and not found.get("port_free"):
        return f"host {host.name}: port {port} is in use there; give another with --master-port"
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
        return _wait(plan, jobs)
    finally:
        _stop(jobs)


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
