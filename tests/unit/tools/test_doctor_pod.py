"""doctor's container and pod checks: /dev/shm, the grace period against the measured save
time, a checkpoint folder every pod sees; each with the manifest's fix (no processes)."""

from __future__ import annotations

from pathlib import Path

from ddpkit.checkpoint.savetimes import record_save_seconds
from ddpkit.tools.doctor.podcheck import (
    check_checkpoint_shared,
    check_grace_period,
    check_shm,
    container_checks,
    filesystem_of,
)
from ddpkit.tools.doctor.preflight import FAIL, PASS, SKIP, WARN

MIB = 2**20
MOUNTS = (
    "22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/l\n"
    "23 22 0:22 / /dev/shm rw - tmpfs shm rw,size=65536k\n"
    "24 22 0:23 / /checkpoints rw - nfs4 fs:/export rw\n"
    "25 22 8:1 / /scratch rw - ext4 /dev/sda1 rw\n"
)


def test_a_containers_64_mib_shm_fails_with_the_manifests_fix() -> None:
    check = check_shm(64 * MIB, workers=2, loader_workers=4)
    assert check.status == FAIL
    assert check.detail.startswith("/dev/shm is 64 MiB; 2 worker(s) with 4 loader worker(s) each")
    assert check.fix is not None and "medium: Memory, sizeLimit: 3Gi" in check.fix
    assert "docker run --shm-size=3g" in check.fix
    assert check_shm(1024 * MIB, workers=2, loader_workers=4).status == WARN
    assert check_shm(4096 * MIB, workers=2, loader_workers=4).status == PASS


def test_the_grace_period_is_compared_with_the_slowest_recent_save(tmp_path: Path) -> None:
    assert check_grace_period(30.0, str(tmp_path)).status == SKIP  # nothing saved yet
    record_save_seconds(tmp_path, 4.0, "epoch_000001.pt")
    assert check_grace_period(30.0, str(tmp_path)).status == PASS
    record_save_seconds(tmp_path, 41.5, "epoch_000002.pt")
    record_save_seconds(tmp_path, 3.0, "epoch_000003.pt")
    check = check_grace_period(30.0, str(tmp_path))
    assert check.status == FAIL
    assert "the slowest recent save took 41.5 s (epoch_000002.pt)" in check.detail
    assert check.fix is not None and "terminationGracePeriodSeconds to 93" in check.fix


def test_the_checkpoint_folder_must_be_on_a_file_system_every_pod_sees() -> None:
    assert filesystem_of("/checkpoints/wine", MOUNTS) == ("nfs4", "/checkpoints")
    assert check_checkpoint_shared("/checkpoints/wine", pods=2, mounts=MOUNTS).status == PASS
    overlay = check_checkpoint_shared("/runs/wine", pods=2, mounts=MOUNTS)
    assert overlay.status == FAIL and "on overlay (mounted at /)" in overlay.detail
    assert overlay.fix is not None and "--checkpoint-pvc" in overlay.fix
    assert check_checkpoint_shared("/scratch/w", pods=1, mounts=MOUNTS).status == WARN
    assert check_checkpoint_shared("/scratch/w", pods=None, mounts=MOUNTS).status == PASS
    assert check_checkpoint_shared("s3://bucket/run", pods=4).status == PASS


def test_a_file_url_is_the_pods_own_disk_as_the_checkpointer_takes_it(tmp_path: Path) -> None:
    """file:///PATH is a folder on this pod's file system (storage.is_url), not an object store:
    checked where it is mounted, and its recorded saves compared with the grace period."""
    own_disk = check_checkpoint_shared("file:///runs/wine", pods=2, mounts=MOUNTS)
    assert own_disk.status == FAIL and "on overlay (mounted at /)" in own_disk.detail
    shared = check_checkpoint_shared("file:///checkpoints/wine", pods=2, mounts=MOUNTS)
    assert shared.status == PASS and "on nfs4" in shared.detail
    record_save_seconds(tmp_path, 41.5, "epoch_000002.pt")
    assert check_grace_period(30.0, f"file://{tmp_path}").status == FAIL


def test_in_a_trainjob_pod_doctor_reads_the_workers_and_the_grace_period() -> None:
    env = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "0",
           "PET_MASTER_ADDR": "w-node-0-0.w", "PET_MASTER_PORT": "29500",
           "DDPKIT_GRACE_PERIOD": "45"}  # fmt: skip
    shm, grace, folder = container_checks(env, None, 0, None, "/nonexistent")
    assert "4 worker(s) with 0 loader worker(s)" in shm.detail
    assert grace.detail.startswith("45 s")
    assert folder.status in (FAIL, WARN)  # a pod's own file system


def test_in_a_pod_the_master_checked_is_node_0_of_the_contract() -> None:
    from ddpkit.tools.doctor.netcheck import master_endpoint

    env = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "w-node-0-0.w",
           "PET_MASTER_PORT": "29500"}  # fmt: skip
    endpoint = master_endpoint(None, None, env)
    assert (endpoint.host, endpoint.port) == ("w-node-0-0.w", 29500)
    assert endpoint.source == "from the Kubeflow TrainJob"
    assert master_endpoint("10.0.0.1:1234", None, env).source == "from --master"
