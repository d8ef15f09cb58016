"""The tutorials' ImageNet command and the linear example, run as users run them (CPU, gloo).

A generated folder of 8 classes (8 training and 2 validation images each, 32 pixels) keeps
resnet18 to a few seconds an epoch on 2 cores; what is checked is the plumbing: ranks,
rendezvous, checkpoints, top-1 / top-5, errors.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launch_helpers import REPO, ddpkit_cli, folder_names, processes_running, worker_lines

pytestmark = pytest.mark.multiproc

SMALL = ["--arch", "resnet18", "--image-size", "32", "-b", "32", "-j", "0", "-p", "1"]
TUTORIAL = [*SMALL[:6], *SMALL[8:]]  # as the tutorial runs it: the default -j 4 loader workers


def python(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny-imagenet")
    made = python("examples/make_image_folder.py", "--classes", "8", "--per-class", "8",
                  "--size", "32", str(root))  # fmt: skip
    assert made.returncode == 0, made.stderr
    return root


@pytest.fixture(scope="module")
def tutorial_run(images: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The tutorial's command line, one epoch on 2 CPU processes, a temporary file URL, the
    default -j: 2 loader processes per rank, started by spawn inside ddpkit.spawn's workers."""
    work = tmp_path_factory.mktemp("tutorial")
    done = _tutorials_command(images, work)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, work / "ckpt"


def _tutorials_command(images: Path, work: Path) -> subprocess.CompletedProcess[str]:
    work.mkdir(exist_ok=True)  # the folder of the file:// URL
    return python(
        "examples/imagenet.py", str(images), "--arch", "resnet18", "--dist-url",
        f"file://{work / 'pg'}", "--dist-backend", "gloo", "--world-size", "1",
        "--multiprocessing-distributed", "--rank", "0", "--nproc-per-node", "2",
        "--epochs", "1", *TUTORIAL[2:], "--checkpoint-dir", str(work / "ckpt"),
    )  # fmt: skip


def test_the_tutorials_command_trains_on_two_processes_and_reports_top1_top5(
    tutorial_run: tuple[str, Path],
) -> None:
    out, checkpoints = tutorial_run
    assert "images and models: Pillow and examples/resnet.py" in out
    assert "world size 2 (2 processes per node x 1 node), backend gloo" in out
    assert "global batch 32 = 16 per device x 2 ranks" in out  # -b is per node, split
    assert re.search(r"epoch 1/1  batch 1/2  loss \d", out)  # -p 1: the tutorial's progress
    summary = re.search(r" \* Acc@1 (\d+\.\d{3}) Acc@5 (\d+\.\d{3})", out)
    assert summary and 0 <= float(summary.group(1)) <= float(summary.group(2)) <= 100
    assert folder_names(checkpoints) == ["epoch_000001.pt"]
    assert processes_running("examples/imagenet.py") == []


def test_resume_continues_and_evaluate_only_evaluates(
    tutorial_run: tuple[str, Path], images: Path, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "ckpt"
    shutil.copytree(tutorial_run[1], checkpoints)
    again = ddpkit_cli("run", "--nproc", "2", "examples/imagenet.py", str(images), *TUTORIAL,
                       "--epochs", "2", "--resume", str(checkpoints))  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {checkpoints / 'epoch_000001.pt'}" in again.stdout
    assert "epoch 2/2  loss" in again.stdout and "epoch 1/2  loss" not in again.stdout
    evaluated = python("examples/imagenet.py", str(images), *SMALL, "--evaluate",
                       "--resume", str(checkpoints))  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert f"resumed from {checkpoints / 'epoch_000002.pt'}" in evaluated.stdout
    assert " * Acc@1 " in evaluated.stdout and "loss" not in evaluated.stdout.split("Acc@5")[0]
    assert folder_names(checkpoints) == ["epoch_000001.pt", "epoch_000002.pt"]


@pytest.mark.oldest_torch  # the venv where torchvision imports (see the Makefile)
def test_the_tutorials_commands_run_with_torchvision_through_both_launchers(
    images: Path, tmp_path: Path
) -> None:
    torchvision = pytest.importorskip("torchvision")
    spawned = _tutorials_command(images, tmp_path / "spawned")
    assert spawned.returncode == 0, spawned.stderr[-3000:]
    launched = ddpkit_cli("run", "--nproc", "2", "examples/imagenet.py", str(images), *TUTORIAL,
                          "--epochs", "1", "--checkpoint-dir", str(tmp_path / "run"))  # fmt: skip
    assert launched.returncode == 0, launched.stderr[-3000:]
    for done in (spawned, launched):
        assert f"images and models: torchvision {torchvision.__version__}" in done.stdout
        assert re.search(r" \* Acc@1 \d+\.\d{3} Acc@5 \d+\.\d{3}", done.stdout)


def test_dummy_images_need_no_folder(tmp_path: Path) -> None:
    done = python("examples/imagenet.py", "--dummy", *SMALL, "--evaluate",
                  "--checkpoint-dir", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"no checkpoint in {tmp_path}: evaluating untrained" in done.stdout
    assert re.search(r" \* Acc@1 \d+\.\d{3} Acc@5 \d+\.\d{3}", done.stdout)  # 1000 classes


def test_a_new_run_will_not_silently_continue_an_old_one(
    tutorial_run: tuple[str, Path], images: Path
) -> None:
    done = python("examples/imagenet.py", str(images), *SMALL, "--epochs", "1",
                  "--checkpoint-dir", str(tutorial_run[1]))  # fmt: skip
    assert done.returncode == 1
    assert f"{tutorial_run[1]} holds checkpoints of an earlier run: --resume" in done.stderr


def test_two_nodes_meet_over_tcp_as_the_tutorial_describes(images: Path, tmp_path: Path) -> None:
    """--world-size 2 nodes, --rank = node rank, one process each, on this host's loopback."""
    port = _free_port_pair()
    nodes = [_start_node(images, rank, port, tmp_path / f"node{rank}") for rank in (0, 1)]
    outputs = [node.communicate(timeout=100) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][1][-2000:]
    assert "world size 2 (1 process per node x 2 nodes)" in outputs[0][0]
    assert " * Acc@1 " in outputs[0][0] and outputs[1][0].strip() == ""  # rank 0 reports
    assert (tmp_path / "node0" / "epoch_000001.pt").exists()


def test_a_missing_split_and_an_unreadable_image_are_named(images: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(images / "train", broken / "train")
    missing = python("examples/imagenet.py", str(broken), *SMALL, "--checkpoint-dir",
                     str(tmp_path / "a"))  # fmt: skip
    assert missing.returncode == 1
    assert f"{broken}/val is missing: expected {broken}/train and {broken}/val" in missing.stderr
    shutil.copytree(images / "val", broken / "val")
    bad = broken / "train" / "class_03" / "00004.png"
    bad.write_bytes(b"not an image")
    unreadable = python("examples/imagenet.py", str(broken), *SMALL, "--epochs", "1",
                        "--checkpoint-dir", str(tmp_path / "b"))  # fmt: skip
    assert unreadable.returncode == 1
    assert f"UnreadableImageError: cannot read image {bad}" in unreadable.stderr


def test_the_linear_example_takes_one_step_per_rank_in_step() -> None:
    done = ddpkit_cli("run", "--nproc", "2", "examples/linear.py")
    assert done.returncode == 0, done.stderr
    lines = sorted(line for line in worker_lines(done.stdout) if line.startswith("rank "))
    assert [line.split(":")[0] for line in lines] == ["rank 0 of 2", "rank 1 of 2"]
    losses = {line.split("loss ")[1].split(",")[0] for line in lines}
    weights = {line.split("sum to ")[1] for line in lines}
    assert len(losses) == 2 and len(weights) == 1  # own batches, one averaged gradient


def _start_node(images: Path, rank: int, port: int, checkpoints: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "examples/imagenet.py", str(images), *SMALL, "--epochs", "1",
               "--dist-url", f"tcp://127.0.0.1:{port}", "--dist-backend", "gloo",
               "--world-size", "2", "--rank", str(rank), "--multiprocessing-distributed",
               "--nproc-per-node", "1", "--checkpoint-dir", str(checkpoints)]  # fmt: skip
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def _free_port_pair() -> int:
    """A port whose next one is free too (the process group's and the launchers')."""
    import socket

    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return int(port)
    raise AssertionError("no two free consecutive ports")
