"""``ddpkit export`` in one process: the newest whole checkpoint of a folder as .pt and
.safetensors, equal to the trained weights bit for bit; bad requests refused, and damage that
torch loads without a word (a flipped bit in a weight) refused by ddpkit's checksums, of a
whole checkpoint and of a sharded (DCP) one."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

import ddpkit
from ddpkit.checkpoint import Position, sharded
from ddpkit.checkpoint.files import list_checkpoints
from ddpkit.cli import main as ddpkit_main
from helpers.mp_workers import toy_model
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
    result = ddpkit.checkpoint.export_checkpoint(folder, tmp_path / f"model{suffix}")
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


def flip_a_bit_of(tensor: torch.Tensor, file: Path) -> None:
    """Flip one bit of ``tensor``'s bytes where ``file`` stores them: the file still loads."""
    data = bytearray(file.read_bytes())
    at = data.find(tensor.numpy().tobytes())
    assert at > 0, f"{file} does not hold the bytes of the tensor"
    data[at] ^= 0x01
    file.write_bytes(bytes(data))


def test_a_corrupted_checkpoint_is_refused_by_its_checksum_and_nothing_is_written(
    trained: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    folder, final = trained
    damaged = tmp_path / "epoch_000002.pt"
    damaged.write_bytes((folder / "epoch_000002.pt").read_bytes())
    flip_a_bit_of(final["0.weight"], damaged)
    loaded = torch.load(damaged, weights_only=True)  # torch reads the wrong number silently
    assert not torch.equal(loaded["model"]["0.weight"], final["0.weight"])
    said = f"checkpoint {damaged} is corrupted: its contents do not match the checksum"
    with pytest.raises(ddpkit.CheckpointError, match=re.escape(said)):
        ddpkit.checkpoint.export_checkpoint(damaged, tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("world", [1, 2], ids=["alone", "as-rank-0-of-2"])
def test_a_damaged_shard_is_refused_by_its_checksum_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world: int
) -> None:
    ddpkit.init()
    model = toy_model(seed=1)
    optimizer = torch.optim.Adam(model.parameters())
    path = sharded.save_sharded(model, [optimizer], {}, tmp_path, Position(3))
    shard, weight = path / "__0_0.distcp", model.state_dict()["0.weight"]
    flip_a_bit_of(weight, shard)
    loaded = {"model": {"0.weight": torch.empty_like(weight)}}
    with warnings.catch_warnings():  # DCP's one-process warning
        warnings.simplefilter("ignore", UserWarning)
        dcp_load(loaded, checkpoint_id=path, no_dist=True)  # torch reads the wrong number
    assert not torch.equal(loaded["model"]["0.weight"], weight)
    # Exported from rank 0 of a job, every shard file is checked, not only rank 0's share.
    monkeypatch.setattr(sharded, "_world_size", lambda: world)
    said = f"sharded checkpoint {path} is damaged: {shard.name} does not match its checksum"
    with pytest.raises(ddpkit.CheckpointError, match=re.escape(said)):
        ddpkit.checkpoint.export_checkpoint(path, tmp_path / "out.pt")
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
        ddpkit.checkpoint.export_checkpoint(folder, tmp_path / out)
