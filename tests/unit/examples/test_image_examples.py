"""The ImageNet example's own parts without processes: ResNet shapes, the folder reader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.launch_helpers import REPO

sys.path.insert(0, str(REPO / "examples"))
import imagefolder
import resnet


@pytest.mark.parametrize(
    ("arch", "parameters", "tensors"),
    [("resnet18", 11_689_512, 122), ("resnet34", 21_797_672, 218), ("resnet50", 25_557_032, 320)],
)
def test_bundled_resnets_have_torchvisions_sizes_and_names(
    arch: str, parameters: int, tensors: int
) -> None:
    model = resnet.resnet(arch, num_classes=1000)
    state = model.state_dict()
    assert sum(p.numel() for p in model.parameters()) == parameters  # torchvision's figures
    assert len(state) == tensors
    assert {"conv1.weight", "bn1.running_mean", "layer2.0.downsample.0.weight", "fc.bias"} <= set(
        state
    )
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 1000)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("images")
    subprocess.run(
        [sys.executable, "examples/make_image_folder.py", "--classes", "3", "--per-class", "4",
         "--size", "40", str(root)], cwd=REPO, check=True, capture_output=True,
    )  # fmt: skip
    return root


def test_the_pillow_reader_reads_the_folder_as_imagefolder_does(folder: Path) -> None:
    train = imagefolder.PillowImageFolder(folder / "train", imagefolder.TrainTransform(32))
    val = imagefolder.PillowImageFolder(folder / "val", imagefolder.ValTransform(24))
    assert train.classes == ["class_00", "class_01", "class_02"] and len(train) == 12
    image, target = train[5]
    assert image.shape == (3, 32, 32) and target == 1
    assert val[0][0].shape == (3, 24, 24) and len(val) == 6
    assert -3 < float(image.mean()) < 3  # normalized, not raw 0..255


def test_the_generated_classes_differ_by_colour(folder: Path) -> None:
    val = imagefolder.PillowImageFolder(folder / "val", imagefolder.ValTransform(32))
    means = [torch.stack([val[i][0] for i in range(j * 2, j * 2 + 2)]).mean((0, 2, 3))
             for j in range(3)]  # fmt: skip
    assert min((a - b).abs().max() for a, b in [(means[0], means[1]), (means[1], means[2])]) > 0.1


def test_layout_problems_name_the_missing_split(folder: Path, tmp_path: Path) -> None:
    assert imagefolder.check_layout(folder) == []
    (tmp_path / "train" / "cats").mkdir(parents=True)
    assert imagefolder.check_layout(tmp_path) == [
        f"{tmp_path}/val is missing: expected {tmp_path}/train and {tmp_path}/val, each with "
        "one folder of images per class"
    ]


def test_an_unreadable_image_is_named(tmp_path: Path) -> None:
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png at all")
    with pytest.raises(imagefolder.UnreadableImageError, match=f"cannot read image {broken}"):
        imagefolder.load_rgb(broken)


def test_the_pillow_datasets_pickle_for_spawned_loader_workers(folder: Path) -> None:
    """DataLoader workers started by spawn (the default inside ``ddpkit.spawn``'s workers)
    receive the dataset pickled; closures as transforms made the tutorial's -j 4 fail."""
    import pickle

    train = imagefolder.PillowImageFolder(folder / "train", imagefolder.TrainTransform(32))
    again = pickle.loads(pickle.dumps(train))
    assert again[3][0].shape == (3, 32, 32) and again[3][1] == train[3][1]
