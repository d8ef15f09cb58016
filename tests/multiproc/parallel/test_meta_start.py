"""A model built on the meta device and filled from a weights file, on gloo workers: each
rank holds its shards of exactly the file's values (FSDP on 2, HSDP as a 2x2 mesh), and the
GPT started that way passes ``ddpkit verify``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import ddpkit
from helpers import strategy_workers as workers
from helpers.launch_helpers import ddpkit_cli

pytestmark = pytest.mark.multiproc


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """The GPT's weights from seed 11, as a Hugging Face save has them (the tied head once)."""
    gpt = workers.load_example("gpt")
    torch.manual_seed(11)
    state = {k: v.clone() for k, v in gpt.GPT(gpt.GPTConfig()).state_dict().items()}
    path = tmp_path_factory.mktemp("weights") / "gpt.safetensors"
    save_file({k: v for k, v in state.items() if k != "head.weight"}, str(path))
    return path, state


@pytest.mark.parametrize(("workers_", "strategy", "shard"), [(2, "fsdp", None), (4, "hsdp", 2)])
def test_every_rank_holds_its_shards_of_the_files_values(
    weights: tuple[Path, dict[str, torch.Tensor]], workers_: int, strategy: str, shard: int | None
) -> None:
    path, expected = weights
    ranks = ddpkit.spawn(workers.started_on_meta, workers_, strategy, str(path), shard)
    total = sum(t.numel() for k, t in expected.items() if k != "head.weight")  # tied: once
    for rank in ranks:
        assert rank["state"].keys() == expected.keys()
        assert all(torch.equal(rank["state"][k], v) for k, v in expected.items())
        assert rank["local"] <= total / (shard or workers_) + 1000  # a shard each, not the model


@pytest.mark.timeout(300)
def test_verify_passes_for_the_gpt_started_on_the_meta_device_under_fsdp(
    weights: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    done = ddpkit_cli(
        "verify", "examples/gpt.py", "--workers", "2", "--steps", "4", "--out", str(tmp_path),
        "--strategy", "fsdp", "--weights", str(weights[0]), timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("PASS: 2 workers computed what one process computes")
    initial = torch.load(tmp_path / "reference" / "params.pt", weights_only=True)["initial"]
    assert torch.equal(initial["tokens.weight"], weights[1]["tokens.weight"])  # the file's
