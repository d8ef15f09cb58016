"""`ddpkit doctor`'s checks, one status path at a time (no worker processes)."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ddpkit import ConfigError
from ddpkit.cli import build_parser, main
from ddpkit.launch import jobs
from ddpkit.tools.doctor import envinfo, netcheck, preflight, probe
from ddpkit.tools.doctor.command import (
    DoctorOptions,
    build_report,
    machine_checks,
    options_from_args,
    render,
)
from ddpkit.tools.doctor.netcheck import Endpoint, check_master_port
from ddpkit.tools.doctor.preflight import FAIL, PASS, SKIP, WARN, Check

WINE_SETUP = {
    "kind": "setup",
    "world_size": 2,
    "strategy": "ddp",
    "per_device_batch": 32,
    "global_batch": 64,
    "batch_policy": "per_device",
    "lr": 0.001,
    "precision": "fp32",
}


def doctor_checks(*argv: str, environ: dict[str, str] | None = None) -> dict[str, Check]:
    """Checks 1-8 for `ddpkit doctor ARGV`, by name."""
    options = options_from_args(build_parser().parse_args(["doctor", *argv]))
    env = {} if environ is None else environ
    return {c.name: c for c in machine_checks(options, env, envinfo.collect(env))}


@pytest.fixture
def listener() -> Iterator[int]:
    """A port this test process listens on (127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- master port -------------------------------------------------------------------------


def test_a_port_in_use_fails_naming_the_port_and_its_owner(listener: int) -> None:
    check = doctor_checks("--master", f"127.0.0.1:{listener}")["master port"]
    assert check.status == FAIL
    assert f"127.0.0.1:{listener} is in use by pid {os.getpid()}" in check.detail
    assert f"stop pid {os.getpid()}" in str(check.fix)


def test_a_free_local_port_passes() -> None:
    port = closed_port()
    check = doctor_checks("--master", f"127.0.0.1:{port}")["master port"]
    assert (check.status, check.detail) == (PASS, f"127.0.0.1:{port} is free (from --master)")


def test_master_addr_and_port_come_from_the_environment(listener: int) -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(listener)}
    check = doctor_checks(environ=env)["master port"]
    assert check.status == FAIL and "(from MASTER_ADDR/MASTER_PORT)" in check.detail


def test_a_tcp_init_method_names_the_endpoint(listener: int) -> None:
    check = doctor_checks("--init-method", f"tcp://127.0.0.1:{listener}")["master port"]
    assert check.status == FAIL and "(from --init-method)" in check.detail


def test_a_remote_endpoint_nobody_listens_on_is_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Another host, as far as the check knows: the connect branch runs for real.
    monkeypatch.setattr(netcheck, "is_local", lambda addresses, local: False)
    check = check_master_port(Endpoint("127.0.0.1", closed_port(), "from --master"), [])
    assert check.status == WARN
    assert "another host) is not reachable within 2.5 s: Connection refused" in check.detail
    assert "start rank 0 first" in str(check.fix)


def test_a_remote_endpoint_that_accepts_passes(
    monkeypatch: pytest.MonkeyPatch, listener: int
) -> None:
    monkeypatch.setattr(netcheck, "is_local", lambda addresses, local: False)
    check = check_master_port(Endpoint("127.0.0.1", listener, "from --master"), [])
    assert check.status == PASS and check.detail.endswith("another host) is reachable")


def test_an_interface_address_counts_as_this_machine() -> None:
    assert netcheck.is_local(["10.1.2.3"], {"10.1.2.3"})
    assert not netcheck.is_local(["10.1.2.4"], {"10.1.2.3"})
    assert netcheck.is_local(["::1"], set()) and netcheck.is_local(["0.0.0.0"], set())


def test_a_bad_master_port_variable_is_a_failed_check() -> None:
    check = doctor_checks(environ={"MASTER_PORT": "http"})["master port"]
    assert check.status == FAIL and "MASTER_PORT='http' is not a TCP port" in check.detail


def test_malformed_flags_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["doctor", "--master", "10.0.0.1"])
    assert "--master '10.0.0.1' is not ADDR:PORT" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["doctor", "--init-method", "udp://h:1"])
    assert "accepted forms" in capsys.readouterr().err


# --- FileStore ---------------------------------------------------------------------------


def test_a_store_file_nobody_holds_is_left_over_whatever_its_age(tmp_path: Path) -> None:
    store = tmp_path / "pg"
    store.touch()  # seconds old, as after a kill -9
    check = doctor_checks("--init-method", f"file://{store}")["file store"]
    assert check.status == WARN
    assert "is left by a run whose processes are gone" in check.detail
    assert str(check.fix).endswith(f"rm {store}")


def test_a_store_file_a_live_process_holds_is_in_use(tmp_path: Path) -> None:
    import fcntl

    (tmp_path / "pg").touch()
    with open(tmp_path / "pg.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # as every rank using the file does
        check = preflight.check_file_store(f"file://{tmp_path}/pg")
    assert check.status == WARN and "is in use by a running job" in check.detail


def test_an_absent_store_file_in_a_writable_directory_passes(tmp_path: Path) -> None:
    check = preflight.check_file_store(f"file://{tmp_path}/pg")
    assert check.status == PASS
    assert list(tmp_path.iterdir()) == []  # the write probe cleaned up after itself


def test_a_missing_directory_fails(tmp_path: Path) -> None:
    check = preflight.check_file_store(f"file://{tmp_path}/no/such/pg")
    assert (check.status, check.detail) == (FAIL, f"{tmp_path}/no/such does not exist")
    assert f"mkdir -p {tmp_path}/no/such" in str(check.fix)


def test_a_file_where_the_directory_should_be_fails(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    check = preflight.check_file_store(f"file://{tmp_path}/plain/pg")
    assert check.status == FAIL and check.detail.endswith("plain is not a directory")


def test_an_unwritable_directory_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests may run as root, which writes anywhere: refuse the write probe instead.
    def refuse(**_: object) -> tuple[int, str]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    check = preflight.check_file_store(f"file://{tmp_path}/pg")
    assert check.status == FAIL
    assert check.detail == f"cannot create a file in {tmp_path}: Permission denied"


def test_store_check_skips_without_a_file_url() -> None:
    assert preflight.check_file_store(None).status == SKIP
    assert preflight.check_file_store("env://").status == SKIP


# --- socket interfaces, hostname, launcher ---------------------------------------------------


def test_a_missing_gloo_interface_fails_listing_the_real_ones() -> None:
    check = doctor_checks(environ={"GLOO_SOCKET_IFNAME": "nosuch0"})["socket interfaces"]
    names = [i["name"] for i in envinfo.interfaces()]
    assert "lo" in names
    assert check.status == FAIL
    assert "GLOO_SOCKET_IFNAME=nosuch0 names no interface here" in check.detail
    assert f"interfaces: {', '.join(names)}" in check.detail


@pytest.mark.parametrize(
    ("env", "status"),
    [
        ({"GLOO_SOCKET_IFNAME": "lo,eth0"}, PASS),
        ({"GLOO_SOCKET_IFNAME": "eth"}, FAIL),  # gloo wants whole names
        ({"NCCL_SOCKET_IFNAME": "eth"}, PASS),  # NCCL: a prefix
        ({"NCCL_SOCKET_IFNAME": "=eth"}, FAIL),  # NCCL: "=" asks for the exact name
        ({"NCCL_SOCKET_IFNAME": "^docker,lo"}, PASS),  # NCCL: "^" excludes
        ({"NCCL_SOCKET_IFNAME": "^lo,eth"}, FAIL),  # ... and here excludes everything
        ({"TP_SOCKET_IFNAME": "wlan0"}, FAIL),
        ({}, SKIP),
    ],
)
def test_socket_interface_forms(env: dict[str, str], status: str) -> None:
    assert netcheck.check_socket_interfaces(env, ["lo", "eth0"]).status == status


def test_rank_without_world_size_fails_with_ddpkits_message() -> None:
    check = doctor_checks(environ={"RANK": "1"})["launcher"]
    assert check.status == FAIL
    assert check.detail.startswith("RANK is set but WORLD_SIZE is not")


def test_a_torchrun_world_is_named() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
           "MASTER_PORT": "29500"}  # fmt: skip
    check = preflight.check_launcher(env)
    assert (check.status, check.detail) == (PASS, "torchrun: rank 1 of 4 (node 0, local rank 1)")


def test_an_unresolvable_hostname_warns_with_local_addr() -> None:
    check = netcheck.check_hostname("no-such-host.invalid", "no-such-host.invalid", False)
    assert check.status == WARN and "--local-addr" in str(check.fix)


def test_a_loopback_hostname_only_warns_for_several_nodes() -> None:
    assert netcheck.check_hostname("localhost", "localhost", multi_node=False).status == PASS
    check = netcheck.check_hostname("localhost", "localhost", multi_node=True)
    assert check.status == WARN and "unreachable from other nodes" in check.detail


# --- backend, NCCL, threads -----------------------------------------------------------------


def test_the_backend_check_runs_a_real_group_and_leaves_none() -> None:
    check = preflight.check_backend("gloo", torch.device("cpu"))
    assert check.status == PASS and check.name == "backend gloo"
    assert not dist.is_initialized()


def test_the_backend_check_leaves_an_existing_group_alone() -> None:
    from torch.distributed import HashStore

    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1,
                            timeout=timedelta(seconds=30))  # fmt: skip
    try:
        assert preflight.check_backend("gloo", torch.device("cpu")).status == SKIP
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


def test_a_failing_backend_is_a_failed_check_not_a_traceback() -> None:
    check = preflight.check_backend("nccl", torch.device("cpu"))  # no NCCL on a CPU build
    assert check.status == FAIL and "1-process nccl group" in check.detail
    assert not dist.is_initialized()


def test_gpus_without_nccl_fail_and_no_gpu_skips() -> None:
    check = preflight.check_nccl(gpu_count=2, nccl_available=False)
    assert check.status == FAIL and "2 GPU(s) visible" in check.detail
    assert "download.pytorch.org" in str(check.fix)
    assert preflight.check_nccl(gpu_count=0, nccl_available=False).detail == "no GPU"
    assert preflight.check_nccl(4, True, "2.21.5").detail == "NCCL 2.21.5 for 4 GPU(s)"


def test_oversubscribed_threads_warn_with_the_numbers() -> None:
    check = preflight.check_threads({"OMP_NUM_THREADS": "2", "LOCAL_WORLD_SIZE": "4"}, None, 2)
    assert check.status == WARN
    assert "4 worker(s) (LOCAL_WORLD_SIZE) x 2 thread(s) (OMP_NUM_THREADS) = 8 thread(s)" in (
        check.detail
    )
    assert "on 2 usable core(s): oversubscribed" in check.detail
    assert str(check.fix).startswith("export OMP_NUM_THREADS=1")


def test_threads_that_fit_pass_and_ddpkit_runs_default_is_counted() -> None:
    assert preflight.check_threads({"OMP_NUM_THREADS": "1"}, 2, 2).status == PASS
    check = preflight.check_threads({}, 2, 2)  # `ddpkit run` would give each worker 1 thread
    assert check.status == PASS and "ddpkit run's default" in check.detail
    assert preflight.check_threads({"OMP_NUM_THREADS": "zero"}, None, 2).status == FAIL


# --- batch / LR advice, GPU utilization, run outcomes ------------------------------------


def test_per_device_batch_without_lr_scaling_warns_with_both_options() -> None:
    check = preflight.batch_advice(WINE_SETUP)
    assert check.status == WARN
    assert "global batch 64 = 32 per device x 2 rank(s)" in check.detail
    assert "2x the batch of 32 the LR was set for" in check.detail
    assert "plan_batch(32, 'global')" in str(check.fix)
    assert "lr_scaling='linear') for SGD, 'sqrt' for Adam" in str(check.fix)


@pytest.mark.parametrize(
    "change",
    [
        {"lr_scaling": "linear", "base_batch": 32},  # scaled with the batch
        {"batch_policy": "global", "per_device_batch": 16, "global_batch": 32},  # split
        {"base_batch": 64},  # the LR was set for the global batch
    ],
)
def test_a_consistent_batch_and_lr_pass(change: dict[str, object]) -> None:
    check = preflight.batch_advice({**WINE_SETUP, **change})
    assert check.status == PASS and check.detail.startswith("global batch")


def test_accumulation_appears_in_the_batch_arithmetic() -> None:
    setup = {**WINE_SETUP, "global_batch": 256, "base_batch": 32, "lr_scaling": "sqrt"}
    assert "32 per device x 2 rank(s) x 4 micro-steps" in preflight.batch_advice(setup).detail


def test_a_failed_run_fails_with_the_launchers_verdict() -> None:
    output = (
        "ddpkit run: 2 worker(s) on this node\n[rank0]: noise\n"
        "ddpkit run: worker rank 1 failed (exit code 1):\nValueError: bad batch"
    )
    run = probe.RunProbe(jobs.Outcome(1, output, 3.0), None, [])
    check = probe.batch_check(run, "`ddpkit run --nproc 2 t.py`")
    assert check.status == FAIL
    assert check.detail.splitlines() == [
        "`ddpkit run --nproc 2 t.py` exited with code 1; its output ends with:",
        "ddpkit run: worker rank 1 failed (exit code 1):",
        "ValueError: bad batch",
    ]


def test_a_run_without_a_setup_record_skips_the_advice() -> None:
    run = probe.RunProbe(jobs.Outcome(0, "", 3.0), None, [])
    assert probe.batch_check(run, "t.py").status == SKIP


def test_low_gpu_utilization_warns_and_idle_edges_are_ignored() -> None:
    check = probe.check_gpu_utilization([0, 0, 30, 50, 40, 0], gpu_count=2, ran=True)
    assert check.status == WARN and "mean utilization 40% over 3 sample(s)" in check.detail
    assert "num_workers" in str(check.fix)
    assert probe.check_gpu_utilization([0, 90, 95, 0], 1, ran=True).status == PASS
    assert probe.check_gpu_utilization([], 1, ran=False).status == SKIP
    assert probe.check_gpu_utilization([], 0, ran=True).detail == "no GPU"


# --- options, output -------------------------------------------------------------------------


def test_script_arguments_follow_run_or_a_double_dash() -> None:
    def options(*argv: str) -> DoctorOptions:
        return options_from_args(build_parser().parse_args(["doctor", *argv]))

    first = options("--steps", "5", "--run", "wine.py", "--epochs", "2", "--json")
    assert (first.script, first.script_args, first.steps) == (
        "wine.py",
        ("--epochs", "2", "--json"),
        5,
    )
    assert options("--run", "wine.py", "--", "--epochs", "2").script_args == ("--epochs", "2")
    with pytest.raises(ConfigError, match="--run needs a SCRIPT"):
        options("--run")


def test_json_output_parses_and_has_the_keys(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    # A port known to be free: 29500 may be taken by a job on a developer's machine.
    assert main(["doctor", "--json", "--master", f"127.0.0.1:{closed_port()}"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(report) == ["checks", "environment", "ok", "run", "smoke"]
    assert sorted(report["environment"]) == [
        "backends", "cpu", "env", "gpus", "host", "interfaces", "versions", "world"
    ]  # fmt: skip
    assert report["environment"]["env"]["GLOO_SOCKET_IFNAME"] == "lo"
    assert report["environment"]["versions"]["torch"] == torch.__version__
    assert all(sorted(c) == ["detail", "fix", "name", "status"] for c in report["checks"])
    assert [c["name"] for c in report["checks"]][:3] == ["launcher", "backend gloo", "nccl"]


def test_a_failed_check_sets_exit_code_1_without_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  launcher: RANK is set but WORLD_SIZE is not" in out
    assert "Traceback" not in out


def test_human_output_has_a_line_per_check_and_indented_fixes() -> None:
    report = build_report(DoctorOptions(), {"OMP_NUM_THREADS": "64", "LOCAL_WORLD_SIZE": "2"})
    text = render(report)
    lines = text.splitlines()
    threads = next(i for i, line in enumerate(lines) if line.startswith("WARN  cpu threads:"))
    assert lines[threads + 1].startswith("      fix: export OMP_NUM_THREADS=")
    assert lines[-1].endswith("skip") and "1 warn" in lines[-1]
    assert "ddpkit.init would use: world size" in text


def test_smoke_results_make_a_check_and_a_table() -> None:
    rows = [
        {"bytes": 4096, "time_ms": 0.1, "algbw_gbps": 0.04, "busbw_gbps": 0.04},
        {"bytes": 16 * 2**20, "time_ms": 20.0, "algbw_gbps": 0.84, "busbw_gbps": 0.84},
    ]
    results = {"world_size": 2, "backend": "gloo", "results": rows}
    check = probe.smoke_check(results)
    assert check.detail == "all_reduce correct on 2 ranks (gloo); 16 MiB at 0.84 GB/s bus bandwidth"
    assert "16 MiB" in render({"environment": envinfo.collect({}), "checks": [], "smoke": results,
                               "run": None, "ok": True})  # fmt: skip


def test_the_environment_report_keeps_only_distributed_variables() -> None:
    env = {"SLURM_JOB_ID": "7", "HOME": "/root", "NCCL_DEBUG": "INFO", "DDPKIT_X": "1",
           "OMP_NUM_THREADS": "4", "TORCHELASTIC_RUN_ID": "r", "PMI_RANK": "0"}  # fmt: skip
    assert sorted(envinfo.distributed_env(env)) == [
        "DDPKIT_X", "NCCL_DEBUG", "OMP_NUM_THREADS", "PMI_RANK", "SLURM_JOB_ID",
        "TORCHELASTIC_RUN_ID",
    ]  # fmt: skip
