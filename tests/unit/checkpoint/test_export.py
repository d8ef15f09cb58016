"""``ddpkit export`` of whole checkpoints in one process: the newest of a folder as .pt and
.safetensors, equal to the trained weights bit for bit; damage and bad requests refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ddpkit
from ddpkit.checkpoint.files import list_checkpoints
from ddpkit.cli import main as ddpkit_main
from helpers.resume_helpers import train


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    folder = tmp_path_factory.mktemp("runs")
    final, _ = train(folder, epochs=2)
    ddpkit.shutdown()
    return folder, final


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_the_newest_checkpoint_exports_to_the_trained_weights(
    trained: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path, suffix: str
) -> None:
    folder, final = trained
    result = ddpkit.export_checkpoint(folder, tmp_path / f"model{suffix}")
    assert result.source == str(folder / "epoch_000002.pt") and result.tensors == len(final)
    if suffix == ".pt":
        exported = torch.load(result.path, weights_only=True)
    else:
        exported = load_file(str(result.path))
    assert exported.keys() == final.keys()
    assert all(torch.equal(exported[name], tensor) for name, tensor in final.items())
    assert [p.name for p in tmp_path.iterdir()] == [f"model{suffix}"]  # no temporary left


def test_the_command_says_what_it_wrote(
    trained: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    folder, final = trained
    first = list_checkpoints(folder)[0]
    assert ddpkit_main(["export", str(first), str(tmp_path / "m.pt")]) == 0
    said = capsys.readouterr()
    assert f"exported {len(final)} tensors" in said.out + said.err
    assert (
        f"from {first} to {tmp_path / 'm.pt'}, checksums verified; sha256 " in said.out + said.err
    )


def test_a_corrupted_checkpoint_is_refused_and_nothing_is_written(
    trained: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    folder, _ = trained
    damaged = tmp_path / "epoch_000002.pt"
    data = bytearray((folder / "epoch_000002.pt").read_bytes())
    data[len(data) // 2] ^= 0x01
    damaged.write_bytes(bytes(data))
    with pytest.raises(ddpkit.CheckpointError, match=r"corrupted|could not be loaded"):
        ddpkit.export_checkpoint(damaged, tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize(
    ("source", "out", "error", "said"),
    [
        ("runs", "model.onnx", ddpkit.ConfigError, "the suffix says the format; use one of .pt"),
        ("empty", "model.pt", ddpkit.CheckpointError, "holds no ddpkit checkpoint (epoch_*.pt"),
    ],
    ids=["unknown-suffix", "empty-folder"],
)
def test_requests_that_cannot_be_met_are_refused(
    trained: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path,
    source: str, out: str, error: type[Exception], said: str,
) -> None:  # fmt: skip
    folder = trained[0] if source == "runs" else tmp_path
    with pytest.raises(error, match=re.escape(said)):
        ddpkit.export_checkpoint(folder, tmp_path / out)
