"""``ddpkit run --hosts`` read without torch: the same split and values as torch's parser,
and the full parser wherever the quick reading could differ; a warm server started from
the quick reading, before torch is imported."""

from __future__ import annotations

import argparse
import os

import pytest

from ddpkit._core.protocol import HANG_TIMEOUT_ENV
from ddpkit._core.system import threads_per_worker
from ddpkit.cli import command_parser
from ddpkit.launch.command import parse_quickly
from ddpkit.launch.quickparse import torchrun_flags

READ = ("hosts", "hostfile", "env", "remote_python", "ssh_config", "nnodes", "nproc_per_node",
        "master_port", "master_addr", "master", "rdzv_endpoint", "rdzv_backend", "rdzv_id",
        "standalone", "module", "no_python", "hang_timeout", "training_script",
        "training_script_args")  # fmt: skip

LINES = [
    ["--hosts", "a:2,b:2", "train.py"],
    ["--hostfile", "hosts.txt", "--nproc", "4", "--max-restarts=3", "train.py", "--lr", "1"],
    ["--hosts=a,b", "--nproc_per_node", "2", "--nproc-per-node=3", "-r", "3", "-t3", "x.py"],
    ["--hosts", "gpu[01-02]:8", "--nnodes", "1:2", "--master-port", "29600", "--tee", "3",
     "--env", "SEED=1", "--env", "HOME", "--remote-python", "/opt/py/bin/python", "t.py"],
    ["--hosts", "a,b", "--standalone", "--run-path", "--hang-timeout", "30", "t.py", "--x"],
    ["--hosts", "a,b", "-m", "pkg.train", "--", "--depth=20"],
    ["--hosts", "a,b", "--no-python", "--rdzv-id", "7", "--node_rank", "1", "bash", "-c", "x"],
    ["--hosts", "a,b", "--master", "10.0.0.1:29500", "--local-ranks-filter", "0", "t.py"],
]  # fmt: skip


def full(argv: list[str]) -> argparse.Namespace:
    return command_parser("run").parse_args(argv)


def test_torchs_own_flags_are_read_from_its_source_as_its_parser_has_them() -> None:
    from torch.distributed.run import get_args_parser

    declared = {s: a.nargs != 0 for a in get_args_parser()._actions for s in a.option_strings}
    declared = {s: takes for s, takes in declared.items() if s not in ("-h", "--help")}
    assert torchrun_flags() == declared and "--nnodes" in declared


@pytest.mark.parametrize("argv", LINES, ids=lambda line: " ".join(line)[:40])
def test_a_hosts_line_reads_as_torchs_parser_reads_it(argv: list[str], monkeypatch) -> None:
    for name in [n for n in os.environ if n.startswith("PET_")]:
        monkeypatch.delenv(name)
    quick, whole = parse_quickly(argv), full(argv)
    assert quick is not None, argv
    if "--" in quick.training_script_args:  # kept for the hosts, whose parsers drop it
        quick.training_script_args.remove("--")
    assert {k: getattr(quick, k) for k in READ} == {k: getattr(whole, k) for k in READ}
    assert quick.argv == argv


@pytest.mark.parametrize("argv", [
    ["--nproc", "2", "train.py"],  # no hosts: a launch here
    ["--hosts", "a,b", "--help"],
    ["--hosts", "a,b", "--max-rest", "3", "train.py"],  # an abbreviation torch's parser takes
    ["--hosts", "a,b", "--no-such-flag", "train.py"],
    ["--hosts", "a,b", "--max-restarts"],  # no script
    ["--hosts", "a,b", "--master-port", "next", "train.py"],  # torch's parser says why
    ["--hosts", "a,b"],
])  # fmt: skip
def test_what_the_quick_reading_cannot_vouch_for_goes_to_the_full_parser(argv, monkeypatch):
    monkeypatch.delenv("PET_NPROC_PER_NODE", raising=False)
    assert parse_quickly(argv) is None


def test_a_pet_default_in_the_environment_goes_to_the_full_parser(monkeypatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "4")
    assert parse_quickly(["--hosts", "a,b", "train.py"]) is None
    assert full(["--hosts", "a,b", "train.py"]).nproc_per_node == "4"


def test_a_bad_value_of_ddpkits_own_flag_is_refused_here(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        parse_quickly(["--hosts", "a,b", "--hang-timeout", "soon", "train.py"])
    assert stop.value.code == 2 and "--hang-timeout" in capsys.readouterr().err


WARM = [
    ["--nproc", "2", "--hang-timeout", "30", "t.py"],  # the default: warm workers
    ["--run-path", "--start-method", "forkserver", "--nproc", "2", "--hang-timeout", "30", "t.py"],
    ["--nproc_per_node=2", "--run_path", "--start_method=forkserver", "--hang-timeout=30", "t.py"],
    ["--start-method", "forkserver", "--nproc", "2", "--hang-timeout", "30", "t.py"],
    ["--run-path", "--nproc", "2", "--hang-timeout", "30", "t.py"],
]  # fmt: skip


@pytest.mark.parametrize("argv", WARM, ids=lambda line: " ".join(line)[:40])
def test_warm_workers_start_their_server_from_the_quick_reading(argv, monkeypatch) -> None:
    monkeypatch.delenv("PET_NPROC_PER_NODE", raising=False)
    started: list[dict[str, str]] = []
    monkeypatch.setattr("ddpkit.launch.command.start_warm_server", started.append)
    assert parse_quickly(argv) is None  # the launch itself is read by torch's parser
    assert started == [{"OMP_NUM_THREADS": str(threads_per_worker(2)), HANG_TIMEOUT_ENV: "30.0"}]


@pytest.mark.parametrize("argv", [
    ["--fresh-workers", "--nproc", "2", "t.py"],  # a fresh python per worker, asked for
    ["--run-path", "--fresh-workers", "--nproc", "2", "t.py"],  # spawned from a function
    ["--run-path", "--start-method", "spawn", "--nproc", "2", "t.py"],  # torchrun's meaning
    ["--start-method", "fork", "--nproc", "2", "t.py"],  # torchrun's: a python per worker
    ["--no-python", "--nproc", "2", "echo"],  # an executable: nothing to fork
    ["--run-path", "--start-method", "forkserver", "--nproc", "gpu", "t.py"],  # needs torch
    ["--run-path", "--start-method", "forkserver", "--max-rest", "1", "t.py"],  # abbreviated
])  # fmt: skip
def test_no_server_is_started_early_unless_the_line_asks_for_one_plainly(argv, monkeypatch):
    monkeypatch.delenv("PET_NPROC_PER_NODE", raising=False)
    started: list[dict[str, str]] = []
    monkeypatch.setattr("ddpkit.launch.command.start_warm_server", started.append)
    assert parse_quickly(argv) is None and started == []
