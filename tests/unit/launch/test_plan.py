"""Launcher flags to torch launch configs: every inconsistency named (no processes)."""

from __future__ import annotations

import pytest

from ddpkit import ConfigError
from ddpkit.cli import build_parser
from ddpkit.env.slurm import slurm_nodes
from ddpkit.launch.command import launch_plan
from ddpkit.launch.plan import LaunchPlan, parse_nnodes, to_launch_config

SLURM_PER_NODE = {
    "SLURM_JOB_ID": "777",
    "SLURM_PROCID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS": "2",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_STEP_ID": "0",  # one of srun's tasks, not the batch script
}


def plan_for(*argv: str, environ: dict[str, str] | None = None) -> LaunchPlan:
    return launch_plan(build_parser().parse_args(["run", *argv, "train.py"]), environ or {})


def test_single_node_uses_the_loopback_store() -> None:
    config = to_launch_config(LaunchPlan(nproc=2), "/tmp")
    assert (config.rdzv_backend, config.min_nodes, config.max_nodes) == ("ddpkit-loopback", 1, 1)


def test_static_multi_node_maps_to_torchs_static_rendezvous() -> None:
    plan = plan_for(
        "--nproc", "4", "--nnodes", "2", "--node-rank", "1", "--master", "10.0.0.1:29500"
    )
    config = to_launch_config(plan, "/tmp")
    assert (config.rdzv_backend, config.rdzv_endpoint) == ("static", "10.0.0.1:29500")
    assert config.rdzv_configs["rank"] == 1 and config.nproc_per_node == 4


def test_dynamic_elastic_nodes() -> None:
    plan = plan_for("--nnodes", "1:4", "--rdzv-endpoint", "10.0.0.1:29400", "--rdzv-id", "job7")
    config = to_launch_config(plan, "/tmp")
    assert (config.rdzv_backend, config.run_id) == ("c10d", "job7")
    assert (config.min_nodes, config.max_nodes) == (1, 4)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nnodes", "2"], "needs to know where nodes meet"),
        (["--nnodes", "2", "--master", "h:1"], r"--node-rank None is outside 0\.\.1"),
        (
            ["--nnodes", "2", "--node-rank", "2", "--master", "h:1"],
            r"--node-rank 2 is outside 0\.\.1",
        ),
        (["--nnodes", "1:2", "--node-rank", "0", "--master", "h:1"], "is elastic"),
        (["--nnodes", "2", "--node-rank", "0", "--master", "h"], "is not ADDR:PORT"),
        (["--nnodes", "0"], "1 <= MIN <= MAX"),
        (["--nnodes", "3:2"], "1 <= MIN <= MAX"),
        (["--nnodes", "two"], "is not N or MIN:MAX"),
        (["--master", "h:1", "--rdzv-endpoint", "h:2"], "not both"),
        (["--rdzv-endpoint", "h:2", "--node-rank", "1"], "assigns node ranks"),
        (["--nproc", "0"], "--nproc must be a positive integer"),
        (["--max-restarts", "-1"], "--max-restarts must be >= 0"),
    ],
)
def test_inconsistent_flags_are_named(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_for(*argv)


def test_nnodes_forms() -> None:
    assert parse_nnodes("2") == (2, 2) and parse_nnodes("1:4") == (1, 4)


def test_srun_one_task_per_node_fills_in_the_nodes() -> None:
    plan = plan_for("--nproc", "4", environ=SLURM_PER_NODE)
    assert (plan.mode, plan.nnodes, plan.node_rank) == ("static", "2", 1)
    assert plan.master == "gpu07:20777"  # first host of the node list, port from the job id


def test_srun_with_one_task_per_gpu_is_refused_with_the_fix() -> None:
    env = {**SLURM_PER_NODE, "SLURM_NTASKS": "8"}
    with pytest.raises(ConfigError, match=r"8 tasks on 2 node\(s\).*srun python train\.py"):
        plan_for("--nproc", "4", environ=env)


def test_explicit_flags_win_over_slurm() -> None:
    plan = plan_for("--nproc", "2", "--nnodes", "2", "--node-rank", "0",
                    "--master", "10.9.9.9:1234", environ=SLURM_PER_NODE)  # fmt: skip
    assert plan.master == "10.9.9.9:1234"


def test_single_node_slurm_job_stays_local() -> None:
    env = {**SLURM_PER_NODE, "SLURM_NNODES": "1", "SLURM_NTASKS": "1", "SLURM_NODEID": "0"}
    assert plan_for("--nproc", "2", environ=env).mode == "local"
    assert slurm_nodes(env) is not None


def test_ddpkit_run_in_a_one_node_batch_script_runs_locally() -> None:
    batch = {k: v for k, v in SLURM_PER_NODE.items() if k != "SLURM_STEP_ID"}
    batch.update(SLURM_NNODES="1", SLURM_NTASKS="2", SLURM_NODEID="0", SLURM_PROCID="0")
    assert slurm_nodes(batch) is None  # not a step: `ddpkit run` uses the node it is on
    assert plan_for("--nproc", "2", environ=batch).mode == "local"


def test_ddpkit_run_in_a_multi_node_batch_script_is_refused() -> None:
    batch = {k: v for k, v in SLURM_PER_NODE.items() if k != "SLURM_STEP_ID"}
    batch.update(SLURM_NODEID="0", SLURM_PROCID="0")
    with pytest.raises(ConfigError, match=r"first of its 2 nodes only.*srun ddpkit run"):
        plan_for("--nproc", "2", environ=batch)


TRAINJOB = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "3", "PET_NODE_RANK": "1",
            "PET_MASTER_ADDR": "wine-node-0-0.wine", "PET_MASTER_PORT": "29500"}  # fmt: skip


def pod_plan(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], *argv: str) -> LaunchPlan:
    """The plan in a pod: torch's parser reads PET_* from the process's environment."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return plan_for(*argv, environ=env)


def test_a_trainjob_pod_runs_static_at_node_0s_name(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = pod_plan(monkeypatch, TRAINJOB)
    assert (plan.mode, plan.nnodes, plan.node_rank, plan.nproc) == ("static", "2", 1, 3)
    assert plan.master == "wine-node-0-0.wine:29500"
    assert plan.contract is not None and plan.contract.startswith(
        "Kubeflow TrainJob wine: node 1 of 2"
    )


def test_pet_nnodes_min_max_runs_torchs_c10d_rendezvous_at_node_0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = pod_plan(monkeypatch, {**TRAINJOB, "PET_NNODES": "2:4"})
    assert (plan.mode, plan.nnodes, plan.rdzv_endpoint, plan.rdzv_id) == (
        "dynamic",
        "2:4",
        "wine-node-0-0.wine:29500",
        "wine",
    )
    config = to_launch_config(plan, "/tmp")
    assert (config.rdzv_backend, config.min_nodes, config.max_nodes) == ("c10d", 2, 4)


def test_a_jobset_pod_needs_its_size_from_pet_nnodes_or_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("socket.getfqdn", lambda host="": f"{host}.wine.default.svc.cluster.local")
    env = {"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "wine-node-0-1"}
    with pytest.raises(ConfigError, match="pass --nnodes N"):
        pod_plan(monkeypatch, env)
    plan = pod_plan(monkeypatch, env, "--nnodes", "2")
    assert (plan.master, plan.node_rank, plan.nnodes) == ("wine-node-0-0.wine:29500", 1, "2")


def test_rendezvous_flags_on_the_command_line_win_over_the_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = pod_plan(monkeypatch, TRAINJOB, "--master", "10.0.0.1:29400", "--node-rank", "0")
    assert (plan.master, plan.node_rank, plan.contract) == ("10.0.0.1:29400", 0, None)
