"""`ddpkit slurm` writes a script that sbatch and bash accept (the real cluster: tests/cluster)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ddpkit import ConfigError
from ddpkit.cli import main
from ddpkit.tools.slurm.fit import check_fits, parse_sinfo
from ddpkit.tools.slurm.script import SbatchOptions, sbatch_script


def directives(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line.removeprefix("#SBATCH ").partition("=")
            assert " " not in value, f"no trailing text on directives: {line!r}"
            found[key] = value
    return found


def test_two_gpu_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--nodes", "2", "--gpus-per-node", "4", "--time", "01:00:00", "--partition", "gpu"]
    assert main(["slurm", "--no-check", *flags, "train.py", "--epochs", "10"]) == 0
    text = capsys.readouterr().out
    assert directives(text) == {
        "--job-name": "ddpkit",
        "--nodes": "2",  # a number, not the tutorial's unexpanded $1
        "--ntasks-per-node": "1",
        "--cpus-per-task": "16",
        "--gpus-per-node": "4",  # every GPU of the node, not gres=gpu:1
        "--time": "01:00:00",
        "--partition": "gpu",
        "--output": "%x-%j.out",
    }
    assert text.splitlines()[-1] == "srun ddpkit run --nproc 4 train.py --epochs 10"


def test_cpu_job_and_quoting(tmp_path: Path) -> None:
    text = sbatch_script(SbatchOptions(nodes=1, nproc_per_node=2), "examples/wine.py",
                         ["--checkpoint-dir", "runs/my run"])  # fmt: skip
    assert "--gpus-per-node" not in text
    assert text.splitlines()[-1].endswith("--checkpoint-dir 'runs/my run'")
    script = tmp_path / "job.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0  # valid shell


def test_more_workers_than_gpus_is_refused() -> None:
    with pytest.raises(ConfigError, match="each worker needs its own GPU"):
        sbatch_script(SbatchOptions(gpus_per_node=2, nproc_per_node=4), "t.py", [])


def test_requeue_script_requeues_on_75_only(tmp_path: Path) -> None:
    text = sbatch_script(
        SbatchOptions(nproc_per_node=2, requeue=True), "t.py", ["--checkpoint-dir", "ck"]
    )
    assert {"--requeue", "--signal", "--open-mode"} <= set(directives(text))
    assert directives(text)["--signal"] == "USR1@120"
    # Run the script's tail with srun and scontrol stubbed: 75 requeues, other codes do not.
    for srun_exit, requeued in ((75, True), (1, False), (0, False)):
        bin_dir = tmp_path / f"bin{srun_exit}"
        bin_dir.mkdir()
        (bin_dir / "srun").write_text(f"#!/bin/bash\nexit {srun_exit}\n")
        (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$@" > {bin_dir}/requeued\n')
        for stub in bin_dir.iterdir():
            stub.chmod(0o755)
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_CPUS_PER_TASK": "8"}
        done = subprocess.run(["bash", "-c", text], env=env, capture_output=True, text=True)
        assert done.returncode == srun_exit, done.stderr
        assert (bin_dir / "requeued").exists() == requeued
    assert (tmp_path / "bin75" / "requeued").read_text() == "requeue 42\n"


def test_sinfo_lines_become_node_groups() -> None:
    groups = parse_sinfo("debug*|2|8+|(null)\ngpu|4|64|gpu:a100:8(S:0-1),mps:100\ngpu|1|32|gpu:2")
    assert [(g.partition, g.nodes, g.cpus, g.gpus, g.default) for g in groups] == [
        ("debug", 2, 8, 0, True), ("gpu", 4, 64, 8, False), ("gpu", 1, 32, 2, False)
    ]  # fmt: skip


GROUPS = parse_sinfo("debug*|1|2|(null)\ngpu|4|64|gpu:8\ngpu|1|32|gpu:2")


def test_a_job_no_node_can_hold_is_refused_with_the_numbers() -> None:
    with pytest.raises(
        ConfigError, match=r"for 8 CPUs, but partition debug's nodes have at most 2"
    ):
        check_fits(SbatchOptions(nproc_per_node=2), GROUPS)  # 4 CPUs per worker by default
    with pytest.raises(ConfigError, match=r"asks for 6 nodes but partition gpu has 5"):
        check_fits(SbatchOptions(nodes=6, gpus_per_node=2, partition="gpu"), GROUPS)
    with pytest.raises(ConfigError, match=r"8 GPUs.*at most 64 CPUs and 8 GPUs"):
        check_fits(SbatchOptions(nodes=5, gpus_per_node=8, partition="gpu"), GROUPS)


def test_a_job_that_fits_passes() -> None:
    check_fits(SbatchOptions(nproc_per_node=2, cpus_per_task=2), GROUPS)
    check_fits(SbatchOptions(nodes=4, gpus_per_node=8, partition="gpu"), GROUPS)
    check_fits(SbatchOptions(partition="elsewhere"), GROUPS)  # unknown: sbatch will say so
