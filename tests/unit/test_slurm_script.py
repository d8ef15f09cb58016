"""`ddpkit slurm` writes a script that sbatch and bash accept (the real cluster: tests/cluster)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ddpkit import ConfigError
from ddpkit.cli import main
from ddpkit.slurm import SbatchOptions, sbatch_script


def directives(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line.removeprefix("#SBATCH ").partition("=")
            assert " " not in value, f"no trailing text on directives: {line!r}"
            found[key] = value
    return found


def test_two_gpu_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["slurm", "--nodes", "2", "--gpus-per-node", "4", "--time", "01:00:00",
                 "--partition", "gpu", "train.py", "--epochs", "10"]) == 0  # fmt: skip
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
