"""A throw-away SLURM cluster for the tests: munged, slurmctld and slurmd on loopback, or one
slurmd on each of several virtual hosts (:mod:`helpers.netns`) for multi-node jobs.

Everything lives in one temporary folder (key, config, state, spool, logs); the daemons run
in the foreground as children of pytest, each tied to it with PR_SET_PDEATHSIG so that even a
killed pytest leaves none behind. :meth:`SlurmCluster.stop` cancels the jobs, stops the
daemons, then kills whatever still carries this cluster's SLURM_CONF (job steps, stepds).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from helpers.netns import VirtualHost

PACKAGES = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
}
TERMINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")

_CONFIG = """\
ClusterName=ddpkit-test
SlurmctldHost={host}({ctld_address})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job waits this long before it starts again (default 120 s; 5 is the least)
AuthInfo=socket={root}/run/munge.socket,cred_expire=5
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobRequeue=1
ReturnToService=2
KillWait=30
# a tiny cluster can afford to look at its queue every second (defaults: 60 s and 30 s)
SchedulerParameters=sched_interval=1,bf_interval=1
{node_lines}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def missing_binaries() -> dict[str, str]:
    """The cluster's programs that are not on PATH, with the Debian package of each."""
    return {binary: pkg for binary, pkg in PACKAGES.items() if shutil.which(binary) is None}


@dataclass
class SlurmCluster:
    """A running cluster: ``env`` is what a user's shell would have to talk to it."""

    root: Path
    env: dict[str, str]
    node: str  # the first node's name
    hosts: list[VirtualHost] = field(default_factory=list)  # none: one node on loopback
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def command(
        self, *args: str, timeout: float = 60, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (sinfo, srun, ddpkit, ...) in a shell that talks to this cluster."""
        return subprocess.run(args, env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=cwd)  # fmt: skip

    def sbatch(self, script: Path, *flags: str, cwd: Path) -> int:
        """Submit ``script`` as a user in ``cwd`` would; returns the job id."""
        done = self.command("sbatch", "--parsable", f"--chdir={cwd}", *flags, str(script))
        assert done.returncode == 0, f"sbatch refused {script}: {done.stderr}"
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, ExitCode, Restarts, ...)."""
        done = self.command("scontrol", "show", "job", "--oneliner", str(job_id))
        assert done.returncode == 0, done.stderr
        fields = (item.partition("=") for item in done.stdout.split())
        return {key: value for key, _, value in fields}

    def wait(
        self, job_id: int, timeout: float, states: tuple[str, ...] = TERMINAL_STATES
    ) -> dict[str, str]:
        """Poll until the job reaches one of ``states``; fails the test after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info["JobState"] in states:
                return info
            time.sleep(0.5)
        self.command("scancel", str(job_id))
        raise AssertionError(f"job {job_id} still {info['JobState']} after {timeout} s: {info}")

    def cancel_all(self, timeout: float = 60) -> None:
        """Cancel every job and wait until the queue is empty."""
        self.command("scancel", "--user=root")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.command("squeue", "--noheader").stdout.strip():
                return
            time.sleep(0.5)
        raise AssertionError(f"jobs still queued {timeout} s after scancel")

    def stop(self) -> list[str]:
        """Stop everything; returns the processes that survived even SIGKILL (should be none)."""
        try:
            self.cancel_all()
        finally:
            for daemon in reversed(self.daemons):  # slurmd, slurmctld, then munged
                _end(daemon)
            for pid in self.processes():
                _kill(pid)
        time.sleep(0.2)
        left = [_describe(pid) for pid in self.processes()]
        if not left:
            shutil.rmtree(self.root, ignore_errors=True)
        return left

    def job_processes(self, settle_s: float = 30) -> list[str]:
        """What still runs besides the daemons (job steps, tasks), once ``settle_s`` passed
        without it ending."""
        daemons = {daemon.pid for daemon in self.daemons}
        deadline = time.monotonic() + settle_s
        while True:
            others = [_describe(p) for p in self.processes() if p not in daemons]
            others = [o for o in others if "slurmscriptd" not in o]  # slurmctld's own helper
            if not others or time.monotonic() > deadline:
                return others
            time.sleep(0.5)

    def processes(self) -> list[int]:
        """Pids of this cluster's daemons, stepds and job tasks (by config path in env/argv)."""
        mark = str(self.root).encode()
        found = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                blob = (proc / "environ").read_bytes() + (proc / "cmdline").read_bytes()
            except OSError:  # ended while we looked, or not ours to read
                continue
            if mark in blob and int(proc.name) != os.getpid():
                found.append(int(proc.name))
        return found


def start_cluster(hosts: list[VirtualHost] | None = None) -> SlurmCluster:
    """Write a config and start munged, slurmctld and a slurmd on this host, or one on each of
    ``hosts`` (jobs there see their host's name and address); waits until every node is idle."""
    # munged insists every folder above its socket is world-executable: /tmp/x, not pytest's 0700.
    root = Path(tempfile.mkdtemp(prefix="ddpkit-slurm-", dir="/tmp"))
    root.chmod(0o755)
    hosts = hosts or []
    for sub in ("state", "spool", "log", "run", "munge"):
        (root / sub).mkdir()
    for host in hosts or [None]:  # slurmd wants its spool folder made
        (root / "spool" / (host.name if host else _node_name())).mkdir()
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    first = hosts[0].name if hosts else _node_name()
    cluster = SlurmCluster(root=root, env=_client_env(root, hosts), node=first, hosts=hosts)
    (root / "slurm.conf").write_text(_config(cluster))
    try:
        _start_daemons(cluster)
        _wait_idle(cluster, timeout=60)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _config(cluster: SlurmCluster) -> str:
    # slurmd -C reports this machine's real CPUs/sockets/memory, which slurmd checks against.
    described = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True)
    hardware = described.stdout.splitlines()[0].split(" ", 1)[1]  # drop NodeName=<hostname>
    host = socket.gethostname().split(".")[0]
    nodes = [f"NodeName={h.name} NodeAddr={h.address} NodeHostname={h.name} {hardware} "
             "State=UNKNOWN" for h in cluster.hosts]  # fmt: skip
    return _CONFIG.format(
        host=host, root=cluster.root, ctld_port=_free_port(), slurmd_port=_free_port(),
        ctld_address=cluster.hosts[0].switch if cluster.hosts else "127.0.0.1",
        node_lines="\n".join(nodes) or f"NodeName={cluster.node} NodeHostname={host} "
        f"{hardware} NodeAddr=127.0.0.1 State=UNKNOWN",
    )  # fmt: skip


def _node_name() -> str:
    # Jobs see SLURM_JOB_NODELIST=<node> and meet at that name, so it must resolve.
    host = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(host)
        return host
    except OSError:
        return "localhost"


def _client_env(root: Path, hosts: list[VirtualHost]) -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)  # `ddpkit` and this python, as in an activated venv
    path = os.pathsep.join([venv_bin, os.environ.get("PATH", "/usr/bin:/bin")])
    # sbatch passes the submitter's environment to the job: the hosts' interface is eth0.
    interface = hosts[0].interface if hosts else os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    return {**os.environ, "SLURM_CONF": str(root / "slurm.conf"), "PATH": path,
            "GLOO_SOCKET_IFNAME": interface}  # fmt: skip


def _start_daemons(cluster: SlurmCluster) -> None:
    root, conf = cluster.root, str(cluster.root / "slurm.conf")
    socket_path = root / "run" / "munge.socket"
    munge = ["munged", "--foreground", f"--key-file={root}/munge/munge.key",
             f"--socket={socket_path}", f"--pid-file={root}/run/munged.pid",
             f"--log-file={root}/log/munged.log", f"--seed-file={root}/munge/seed"]  # fmt: skip
    _spawn(cluster, munge, "munged")
    _wait_for(lambda: socket_path.exists(), 15, "munged's socket", root / "log" / "munged.out")
    _spawn(cluster, ["slurmctld", "-D", "-i", "-f", conf], "slurmctld")
    if not cluster.hosts:
        _spawn(cluster, ["slurmd", "-D", "-f", conf, "-N", cluster.node], "slurmd")
    for host in cluster.hosts:
        _spawn(cluster, host.command("slurmd", "-D", "-f", conf, "-N", host.name), host.name)


def _spawn(cluster: SlurmCluster, argv: list[str], name: str) -> None:
    out = open(cluster.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 - the daemon owns it
    daemon = subprocess.Popen(argv, env=cluster.env, stdout=out, stderr=subprocess.STDOUT,
                              preexec_fn=_die_with_parent, start_new_session=True)  # fmt: skip
    cluster.daemons.append(daemon)


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


def _wait_idle(cluster: SlurmCluster, timeout: float) -> None:
    def idle() -> bool:
        for daemon in cluster.daemons:
            if daemon.poll() is not None:
                log = (cluster.root / "log").glob("*")
                tails = "\n".join(f"{p.name}: {p.read_text(errors='replace')[-800:]}" for p in log)
                raise RuntimeError(f"{daemon.args[0]} exited with {daemon.returncode}:\n{tails}")
        states = cluster.command("sinfo", "--noheader", "--format=%T").stdout.split()
        return states == ["idle"]

    log = cluster.root / "log" / f"slurmd-{cluster.node}.log"
    _wait_for(idle, timeout, "the nodes to be idle", log)


def _wait_for(ready, timeout: float, what: str, log: Path) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-1500:] if log.exists() else "(no log)"
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}; {log}:\n{tail}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _end(daemon: subprocess.Popen[bytes]) -> None:
    if daemon.poll() is None:
        daemon.terminate()
        try:
            daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=5)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _describe(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        argv = "(gone)"
    return f"{pid}: {argv}"
