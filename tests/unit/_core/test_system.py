"""Look-ups on this machine: the cores a process may use, a container's CPU limit included."""

from __future__ import annotations

from pathlib import Path

from ddpkit._core.system import cpu_quota


def test_a_containers_cpu_limit_caps_the_usable_cores(tmp_path: Path) -> None:
    pod = tmp_path / "kubepods" / "pod1"
    pod.mkdir(parents=True)
    (pod / "cpu.max").write_text("250000 100000\n")  # cgroup v2: 2.5 CPUs
    assert cpu_quota(str(tmp_path), "0::/kubepods/pod1\n") == 3
    docker = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    docker.mkdir(parents=True)
    (docker / "cpu.cfs_quota_us").write_text("100000\n")  # cgroup v1: 1 CPU
    (docker / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(str(tmp_path), "4:memory:/x\n2:cpu,cpuacct:/docker/abc\n0::/\n") == 1
    (pod / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(str(tmp_path), "0::/kubepods/pod1\n") is None  # no limit
