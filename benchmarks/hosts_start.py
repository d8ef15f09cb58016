"""What one command over ssh costs: ``ddpkit run --hosts`` against the same two nodes started
by hand, launch to the end of the first optimizer step (``DDPKIT_MAX_STEPS=1``, then exit).

Two hosts are network namespaces with Debian's sshd (the tests' helpers; needs root, iproute2
and openssh-server, which the helper installs with apt-get). "By hand" is what the tutorials'
multi-node lesson does: ``ddpkit run --nnodes 2 --node-rank R --master FIRST:PORT`` started in
each host at once (here directly in its namespace, without ssh). Runs alternate; medians and
their difference are printed. Target (issue 53): within 1.5 s.

    sudo .venv/bin/python benchmarks/hosts_start.py --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from helpers.netns import VirtualHost, virtual_hosts  # noqa: E402
from helpers.sshd import ssh_servers  # noqa: E402

SCRIPT = ["examples/wine.py", "--epochs", "1"]
ENV = {**os.environ, "DDPKIT_MAX_STEPS": "1", "GLOO_SOCKET_IFNAME": "eth0"}


def over_ssh(hosts: list[VirtualHost], config: Path) -> float:
    names = ",".join(h.name for h in hosts)
    command = [sys.executable, "-m", "ddpkit", "run", "--ssh-config", str(config), "--hosts",
               names, "--env", "GLOO_SOCKET_IFNAME=eth0", *SCRIPT]  # fmt: skip
    return _timed([command])


def by_hand(hosts: list[VirtualHost]) -> float:
    master = f"{hosts[0].name}:29500"
    commands = [host.command(sys.executable, "-m", "ddpkit", "run", "--nnodes", "2",
                             "--node-rank", str(rank), "--master", master, *SCRIPT)
                for rank, host in enumerate(hosts)]  # fmt: skip
    return _timed(commands)


def _timed(commands: list[list[str]]) -> float:
    start = time.perf_counter()
    jobs = [subprocess.Popen(c, cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT) for c in commands]  # fmt: skip
    outputs = [job.communicate(timeout=180)[0] for job in jobs]
    took = time.perf_counter() - start
    if any(job.returncode for job in jobs):
        raise SystemExit(b"\n".join(outputs).decode(errors="replace")[-3000:])
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"--hosts over ssh": [], "by hand": []}
    with (
        virtual_hosts(2, prefix="benchhost") as hosts,
        tempfile.TemporaryDirectory() as scratch,
        ssh_servers(hosts, Path(scratch)) as config,
    ):
        for _ in range(args.repeat):
            times["--hosts over ssh"].append(over_ssh(hosts, config))
            times["by hand"].append(by_hand(hosts))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        runs = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:18s} median {medians[name]:.2f} s  (runs: {runs})")
    extra = medians["--hosts over ssh"] - medians["by hand"]
    print(f"--hosts costs {extra:+.2f} s over starting the nodes by hand (target <= 1.5 s)")


if __name__ == "__main__":
    main()
