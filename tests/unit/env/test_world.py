"""World detection from the launcher's environment (no processes)."""

from __future__ import annotations

import re

import pytest
import torch

from ddpkit import ConfigError, World
from ddpkit.env.world import choose_backend

TORCHRUN = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}


def test_no_launcher_is_a_world_of_one() -> None:
    world = World.detect(environ={})
    assert (world.rank, world.local_rank, world.world_size, world.node_rank) == (0, 0, 1, 0)
    assert world.is_main and not world.is_launched
    assert world.device == torch.device("cpu") and world.backend == "gloo"


def test_torchrun_contract_is_read() -> None:
    world = World.detect(environ=TORCHRUN)
    assert (world.rank, world.local_rank, world.world_size) == (3, 1, 4)
    assert (world.local_world_size, world.node_rank, world.num_nodes) == (2, 1, 2)
    assert (world.master_addr, world.master_port) == ("10.0.0.1", 29500)
    assert world.launcher == "torchrun" and not world.is_main


def test_node_rank_and_local_rank_are_derived_when_absent() -> None:
    env = {k: v for k, v in TORCHRUN.items() if k not in ("GROUP_RANK", "LOCAL_RANK")}
    world = World.detect(environ=env)
    assert (world.node_rank, world.local_rank) == (1, 1)


def test_world_is_frozen() -> None:
    world = World.detect(environ={})
    with pytest.raises(AttributeError):
        world.rank = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"RANK": "two"}, "RANK='two' is not an integer"),
        ({"RANK": "4"}, "rank 4 is outside 0..3 (world size 4, from torchrun)"),
        ({"LOCAL_RANK": "2"}, "local rank 2 is outside 0..1"),
        ({"GROUP_RANK": "2"}, "node rank 2 is outside 0..1: world size 4 / 2 processes per node"),
        ({"WORLD_SIZE": "0"}, "must be >= 1"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port"),
    ],
)
def test_bad_values_name_the_variable(change: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        World.detect(environ={**TORCHRUN, **change})


def test_half_set_contract_says_what_is_missing() -> None:
    with pytest.raises(ConfigError, match="RANK is set but WORLD_SIZE is not"):
        World.detect(environ={"RANK": "0"})


def test_multi_process_world_needs_master_address() -> None:
    env = {k: v for k, v in TORCHRUN.items() if k != "MASTER_ADDR"}
    with pytest.raises(ConfigError, match="MASTER_ADDR/MASTER_PORT are not set"):
        World.detect(environ=env)


def test_backend_choice() -> None:
    cpu = torch.device("cpu")
    assert choose_backend(None, cpu) == "gloo"
    assert choose_backend("gloo", cpu) == "gloo"
    with pytest.raises(ConfigError, match="needs CUDA GPUs"):
        choose_backend("nccl", cpu)
    with pytest.raises(ConfigError, match="unknown backend 'ncl'"):
        choose_backend("ncl", cpu)


def test_describe_names_sizes_backend_and_device() -> None:
    text = World.detect(environ=TORCHRUN).describe()
    assert "world size 4" in text and "2 processes per node x 2 nodes" in text
    assert "backend gloo" in text and "device cpu" in text


SLURM_ONE_TASK_PER_GPU = {
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "8",
    "SLURM_NODEID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_JOB_NODELIST": "gpu[03-04]",
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
}


def test_slurm_tasks_are_ranks() -> None:
    world = World.detect(environ=SLURM_ONE_TASK_PER_GPU)
    assert (world.rank, world.local_rank, world.world_size) == (5, 1, 8)
    assert (world.local_world_size, world.node_rank, world.launcher) == (4, 1, "slurm")
    assert (world.master_addr, world.master_port) == ("gpu03", 24242)


def test_slurm_explicit_master_wins() -> None:
    env = {**SLURM_ONE_TASK_PER_GPU, "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29400"}
    world = World.detect(environ=env)
    assert (world.master_addr, world.master_port) == ("10.1.2.3", 29400)


def test_torchrun_variables_win_over_slurm_ones() -> None:
    # `srun ddpkit run train.py`: workers inherit SLURM_* but their ranks come from ddpkit run
    world = World.detect(environ={**SLURM_ONE_TASK_PER_GPU, **TORCHRUN})
    assert (world.rank, world.launcher) == (3, "torchrun")


def test_slurm_uneven_tasks_per_node() -> None:
    env = {**SLURM_ONE_TASK_PER_GPU, "SLURM_STEP_TASKS_PER_NODE": "3,2(x2)", "SLURM_NTASKS": "7",
           "SLURM_PROCID": "6", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "n[1-3]"}  # fmt: skip
    assert World.detect(environ=env).local_world_size == 2


def test_batch_script_of_a_multi_task_job_is_refused_with_the_fix() -> None:
    # `python train.py` in an `#SBATCH --ntasks=2` script: rank 0 would wait for a rank 1
    # that nothing starts. The batch script has SLURM_PROCID=0 but no SLURM_STEP_ID.
    batch = {k: v for k, v in SLURM_ONE_TASK_PER_GPU.items() if k != "SLURM_STEP_ID"}
    batch.update(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0")
    with pytest.raises(ConfigError, match=r"SLURM_NTASKS=8 but .* job 4242's batch script.*srun"):
        World.detect(environ=batch)
    assert World.detect(environ={**batch, "SLURM_STEP_ID": "0"}).world_size == 8


def test_batch_script_of_a_one_task_job_is_a_world_of_one() -> None:
    env = {
        "SLURM_JOB_ID": "9",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NODELIST": "n1",
    }
    world = World.detect(environ=env)
    assert (world.rank, world.world_size, world.launcher) == (0, 1, "slurm")


def test_openmpi_ranks_on_one_node_meet_on_loopback() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_COMM_WORLD_NODE_RANK": "1",  # OpenMPI: rank on the node, not the node index
        "PMIX_NAMESPACE": "prterun-host-1234@1",
    }
    world = World.detect(environ=env)
    assert (world.rank, world.world_size, world.local_rank, world.launcher) == (1, 2, 1, "mpi")
    assert world.node_rank == 0
    assert world.master_addr == "127.0.0.1"
    other = World.detect(
        environ={**env, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    )
    assert other.master_port == world.master_port  # ranks agree on the port without talking


def test_openmpi_across_nodes_needs_an_address() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}  # fmt: skip
    with pytest.raises(ConfigError, match="mpirun: -x MASTER_ADDR -x MASTER_PORT"):
        World.detect(environ=env)


def test_half_set_slurm_contract() -> None:
    with pytest.raises(ConfigError, match="SLURM_PROCID is set but SLURM_NTASKS is not"):
        World.detect(environ={"SLURM_PROCID": "0"})
