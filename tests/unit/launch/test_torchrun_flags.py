"""torchrun's command line under `ddpkit run`: every spelling, torchrun's meaning (no processes)."""

from __future__ import annotations

import pytest
from torch.distributed.elastic.multiprocessing import Std

from ddpkit import ConfigError
from ddpkit.cli import build_parser
from ddpkit.launch.command import launch_plan
from ddpkit.launch.plan import LaunchPlan, to_launch_config
from ddpkit.launch.torchrun_flags import check_supported


def plan_for(*argv: str) -> LaunchPlan:
    return launch_plan(build_parser().parse_args(["run", *argv, "train.py"]), {})


def test_underscore_and_dash_spellings_mean_the_same() -> None:
    for argv in (["--nproc_per_node=3"], ["--nproc-per-node", "3"], ["--nproc", "3"]):
        assert plan_for(*argv).nproc == 3
    static = plan_for("--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "--master_port=1234")
    assert (static.mode, static.master, static.node_rank) == ("static", "10.0.0.1:1234", 1)


@pytest.mark.parametrize(
    "argv",
    [
        ["--standalone"],
        ["--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0"],
        ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400", "--nnodes", "1"],
        ["--nnodes=1", "--node_rank=0", "--master_addr=localhost", "--master_port=12355"],
        ["--nnodes", "1:1"],
    ],
)
def test_one_node_rendezvous_forms_meet_on_ddpkits_loopback_store(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert plan_for(*argv).mode == "local"
    # An endpoint torchrun would listen on is not used here, and ddpkit run says so.
    said = capsys.readouterr().err
    named = any(arg.startswith(("--rdzv", "--master")) for arg in argv)
    assert ("is not used; the workers meet on ddpkit's loopback store" in said) == named


def test_a_remote_c10d_endpoint_is_a_dynamic_job_and_a_static_endpoint_a_master() -> None:
    dynamic = plan_for("--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=node0:29400",
                       "--rdzv_id=456")  # fmt: skip
    assert (dynamic.mode, dynamic.rdzv_endpoint, dynamic.rdzv_id) == (
        "dynamic",
        "node0:29400",
        "456",
    )
    static = plan_for("--nnodes=2", "--node_rank=0", "--rdzv_backend=static",
                      "--rdzv_endpoint=node0:29500")  # fmt: skip
    assert (static.mode, static.master) == ("static", "node0:29500")


def test_logs_conf_and_agent_options_reach_torchs_launch_config() -> None:
    plan = plan_for("--log-dir", "/tmp/l", "-r", "1", "-t", "3", "--local-ranks-filter", "0,1",
                    "--rdzv-conf", "join_timeout=60,timeout=30", "--monitor-interval", "0.5",
                    "--start-method", "fork", "--role", "trainer")  # fmt: skip
    config = to_launch_config(plan, plan.log_dir or "")
    specs = config.logs_specs
    assert (specs._root_log_dir, specs._redirects, specs._tee) == ("/tmp/l", Std.OUT, Std.ALL)
    assert specs._local_ranks_filter == {0, 1}
    assert config.rdzv_configs["join_timeout"] == "60" and config.rdzv_configs["timeout"] == "30"
    assert (config.monitor_interval, config.start_method, config.role) == (0.5, "fork", "trainer")


def test_pet_variables_are_defaults_as_in_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "4")
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PET_NODE_RANK", "1")
    monkeypatch.setenv("PET_MASTER_ADDR", "10.0.0.9")
    monkeypatch.setenv("PET_MASTER_PORT", "2000")
    plan = plan_for()
    assert (plan.nproc, plan.nnodes, plan.node_rank, plan.master) == (4, "2", 1, "10.0.0.9:2000")
    assert plan_for("--nproc_per_node=2").nproc == 2  # a flag wins over PET_*


def test_nproc_per_node_cpu_and_auto_count_this_machine() -> None:
    cpu = plan_for("--nproc-per-node", "cpu").nproc
    assert cpu >= 1 and plan_for("--nproc-per-node", "auto").nproc >= 1
    with pytest.raises(ConfigError, match="--nproc-per-node gpu: Cuda is not available"):
        plan_for("--nproc-per-node", "gpu")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "h:2379"], "etcd-v2 is not supported"),
        (["--rdzv-conf", "timeout"], "'timeout' is not KEY=VALUE"),
        (["--tee", "7"], "--tee '7'"),
        (["--nproc-per-node", "many"], "is not a number, gpu, cpu or auto"),
    ],
)
def test_what_cannot_be_honoured_is_named(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_for(*argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["--numa-binding", "node"],
        ["--event-log-handler", "console"],
        ["--virtual-local-rank"],
        ["--signals-to-handle", "SIGUSR2"],
        ["--shutdown-timeout", "5"],
        ["--no-python", "-m"],
    ],
)
def test_unsupported_torchrun_flags_are_refused_not_ignored(argv: list[str]) -> None:
    args = build_parser().parse_args(["run", *argv, "train.py"])
    with pytest.raises(ConfigError, match=r"ddpkit run does not support|cannot go together"):
        check_supported(args)


def test_a_flag_of_a_newer_torchrun_names_the_torch_that_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ddpkit.launch.torchrun_flags as flags

    monkeypatch.setattr(flags, "torch_at_least", lambda release: False)  # as on torch 2.7
    monkeypatch.setattr(flags, "torch_text", lambda: "2.7")
    args = build_parser().parse_args(["run", "--numa-binding", "node", "train.py"])
    with pytest.raises(ConfigError, match=r"--numa-binding needs torch 2.9 or newer \(this is "
                       r"torch 2.7\), and ddpkit run does not support it either"):  # fmt: skip
        check_supported(args)
