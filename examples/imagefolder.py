"""An image folder and the ImageNet transforms, through torchvision when it is installed.

The layout is torchvision's ``ImageFolder``: ``ROOT/train/<class>/<image>`` and
``ROOT/val/<class>/<image>``, classes numbered in sorted order. Without torchvision, a small
Pillow reader does the same: it finds the images, decodes them to RGB, and applies the
transforms of PyTorch's ImageNet example (training: random resized crop and horizontal flip;
validation: resize to 256/224 of the size and centre crop), then normalizes with ImageNet's
mean and standard deviation. Random choices draw from torch's generator, so ddpkit's per-rank
seeding applies. A file that cannot be decoded is reported with its path.

    >>> train, val, classes = image_folders("data/tiny", size=64)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

try:
    from PIL import Image
except ImportError:  # pragma: no cover - Pillow comes with the examples extra
    Image = None  # type: ignore[assignment]

try:
    import torchvision
except ImportError:
    torchvision = None

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class UnreadableImageError(RuntimeError):
    """An image file that Pillow cannot decode; the message names the file."""


def check_layout(root: str | Path) -> list[str]:
    """The problems with ``root`` as an ImageNet-style folder (empty when it is fine).

    >>> check_layout("/nonexistent")
    ['/nonexistent does not exist']
    """
    root = Path(root)
    if not root.is_dir():
        return [f"{root} does not exist"]
    problems = []
    for split in ("train", "val"):
        folder = root / split
        if not folder.is_dir():
            problems.append(f"{folder} is missing: expected {root}/train and {root}/val, "
                            "each with one folder of images per class")  # fmt: skip
        elif not any(p.is_dir() for p in folder.iterdir()):
            problems.append(f"{folder} has no class folders (one folder of images per class)")
    return problems


def image_folders(root: str | Path, size: int) -> tuple[Dataset[Any], Dataset[Any], list[str]]:
    """Training and validation sets of ``root`` at ``size`` pixels, and the class names."""
    root = Path(root)
    if torchvision is not None:
        from torchvision import datasets

        train = datasets.ImageFolder(str(root / "train"), torchvision_transform(size, True))
        val = datasets.ImageFolder(str(root / "val"), torchvision_transform(size, False))
        return train, val, list(train.classes)
    train_set = PillowImageFolder(root / "train", TrainTransform(size))
    val_set = PillowImageFolder(root / "val", ValTransform(size))
    if val_set.classes != train_set.classes:
        raise ValueError(f"{root}/train and {root}/val have different class folders")
    return train_set, val_set, train_set.classes


class PillowImageFolder(Dataset[tuple[torch.Tensor, int]]):
    """torchvision's ImageFolder layout read with Pillow alone."""

    def __init__(self, root: Path, transform: Callable[[Any], torch.Tensor]) -> None:
        self.classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.samples = [
            (path, index)
            for index, name in enumerate(self.classes)
            for path in sorted((root / name).rglob("*"))
            if path.suffix.lower() in IMAGE_SUFFIXES
        ]
        if not self.samples:
            raise ValueError(f"{root} holds no images ({', '.join(IMAGE_SUFFIXES)})")
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, target = self.samples[index]
        return self.transform(load_rgb(path)), target


def load_rgb(path: Path) -> Any:
    """The image at ``path`` as RGB; an :class:`UnreadableImageError` naming it otherwise."""
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, ValueError, SyntaxError) as err:  # Pillow's errors for a broken file
        raise UnreadableImageError(
            f"cannot read image {path}: {err}; replace or remove that file"
        ) from None


# The transforms are classes, not closures: DataLoader workers started with the spawn method
# (the default inside ``ddpkit.spawn``'s workers, as in any process multiprocessing spawned)
# receive the dataset by pickling, and a local function cannot be pickled.
class TrainTransform:
    """Random resized crop to ``size``, random horizontal flip, tensor, normalize."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: Any) -> torch.Tensor:
        image = random_resized_crop(image, self.size)
        if torch.rand(1).item() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return normalize(to_tensor(image))


class ValTransform:
    """Resize the short side to size * 256 / 224, centre crop ``size``, tensor, normalize."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: Any) -> torch.Tensor:
        size, short = self.size, round(self.size * 256 / 224)
        width, height = image.size
        scale = short / min(width, height)
        image = image.resize((max(1, round(width * scale)), max(1, round(height * scale))),
                             Image.Resampling.BILINEAR)  # fmt: skip
        left, top = (image.size[0] - size) // 2, (image.size[1] - size) // 2
        return normalize(to_tensor(image.crop((left, top, left + size, top + size))))


def random_resized_crop(image: Any, size: int) -> Any:
    """A crop of 8% to 100% of the area and aspect 3/4 to 4/3, resized to ``size`` square."""
    width, height = image.size
    for _ in range(10):
        area = width * height * torch.empty(1).uniform_(0.08, 1.0).item()
        aspect = math.exp(torch.empty(1).uniform_(math.log(3 / 4), math.log(4 / 3)).item())
        w, h = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,)).item())
            left = int(torch.randint(0, width - w + 1, (1,)).item())
            return image.resize((size, size), Image.Resampling.BILINEAR,
                                box=(left, top, left + w, top + h))  # fmt: skip
    side = min(width, height)  # rare: fall back to the central square
    box = ((width - side) // 2, (height - side) // 2, (width + side) // 2, (height + side) // 2)
    return image.resize((size, size), Image.Resampling.BILINEAR, box=box)


def to_tensor(image: Any) -> torch.Tensor:
    """A PIL RGB image as a float tensor [3, H, W] in [0, 1]."""
    width, height = image.size
    pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    return pixels.view(height, width, 3).permute(2, 0, 1).float().div(255)


def normalize(tensor: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    return (tensor - mean) / std


def torchvision_transform(size: int, training: bool) -> Any:
    """The same pipelines with torchvision's transforms."""
    from torchvision import transforms

    steps = (
        [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip()]
        if training
        else [transforms.Resize(round(size * 256 / 224)), transforms.CenterCrop(size)]
    )
    return transforms.Compose([*steps, transforms.ToTensor(), transforms.Normalize(MEAN, STD)])


class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    """``count`` random images of ``size`` pixels in ``classes`` classes (``--dummy``): the
    same for every epoch and rank, generated per index, no files read."""

    def __init__(self, count: int, size: int, classes: int, seed: int = 0) -> None:
        self.count, self.size, self.classes, self.seed = count, size, classes, seed

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        image = torch.randn(3, self.size, self.size, generator=generator)
        return image, int(torch.randint(0, self.classes, (1,), generator=generator).item())
