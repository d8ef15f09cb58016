"""Write a small synthetic image folder that a ResNet can learn: no download needed.

Class k is a shape (circle, square, triangle, cross, ring, diamond, horizontal or vertical
bar) in a colour of its own, drawn at a random place and size on a noisy background of a
random dark grey, so both the shape and the colour tell the class, and no two images are
alike. The layout is torchvision's ImageFolder, as the ImageNet example reads it:

    python examples/make_image_folder.py --classes 10 --per-class 50 --size 64 data/tiny
    data/tiny/train/class_00/00000.png ... (50 per class)
    data/tiny/val/class_00/00000.png ...   (--val-per-class, default a fifth: 10 per class)

The same --seed writes the same images.
"""

from __future__ import annotations

import argparse
import colorsys
import random
from pathlib import Path

from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle", "cross", "ring", "diamond", "hbar", "vbar")


def class_colour(index: int) -> tuple[int, int, int]:
    """A bright colour per class: hues spread by the golden ratio, so neighbours differ."""
    hue = (index * 0.618033988749895) % 1.0
    red, green, blue = colorsys.hsv_to_rgb(hue, 0.85, 0.95)
    return round(red * 255), round(green * 255), round(blue * 255)


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int],
               colour: tuple[int, int, int]) -> None:  # fmt: skip
    left, top, right, bottom = box
    cx, cy = (left + right) // 2, (top + bottom) // 2
    thick = max(2, (right - left) // 4)
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, top), (right, bottom), (left, bottom)], fill=colour)
    elif shape == "cross":
        draw.rectangle((cx - thick // 2, top, cx + thick // 2, bottom), fill=colour)
        draw.rectangle((left, cy - thick // 2, right, cy + thick // 2), fill=colour)
    elif shape == "ring":
        draw.ellipse(box, outline=colour, width=thick)
    elif shape == "diamond":
        draw.polygon([(cx, top), (right, cy), (cx, bottom), (left, cy)], fill=colour)
    elif shape == "hbar":
        draw.rectangle((left, cy - thick, right, cy + thick), fill=colour)
    else:  # vbar
        draw.rectangle((cx - thick, top, cx + thick, bottom), fill=colour)


def make_image(index: int, size: int, rng: random.Random) -> Image.Image:
    """One image of class ``index``."""
    grey = rng.randint(0, 70)
    shades = bytes(min(255, grey + value % 41) for value in range(256))  # noise up to +40
    image = Image.frombytes("RGB", (size, size), rng.randbytes(size * size * 3).translate(shades))
    side = rng.randint(size * 2 // 5, size * 4 // 5)
    left, top = rng.randint(0, size - side), rng.randint(0, size - side)
    jitter = tuple(min(255, max(0, c + rng.randint(-20, 20))) for c in class_colour(index))
    draw_shape(ImageDraw.Draw(image), SHAPES[index % len(SHAPES)],
               (left, top, left + side, top + side), jitter)  # type: ignore[arg-type]  # fmt: skip
    return image


def write_split(root: Path, classes: int, count: int, size: int, rng: random.Random) -> None:
    for index in range(classes):
        folder = root / f"class_{index:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        for number in range(count):
            make_image(index, size, rng).save(folder / f"{number:05d}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the folder to write (train/ and val/ go inside)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--per-class", type=int, default=50, help="training images per class")
    parser.add_argument("--val-per-class", type=int, default=None, help="default: a fifth")
    parser.add_argument("--size", type=int, default=64, help="pixels on a side")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.classes < 1 or args.per_class < 1 or args.size < 16:
        parser.error("--classes and --per-class must be >= 1 and --size >= 16")
    val = args.val_per_class if args.val_per_class is not None else max(2, args.per_class // 5)
    rng = random.Random(args.seed)
    root = Path(args.out)
    write_split(root / "train", args.classes, args.per_class, args.size, rng)
    write_split(root / "val", args.classes, val, args.size, rng)
    print(f"wrote {args.classes} classes x ({args.per_class} train + {val} val) images of "
          f"{args.size}x{args.size} to {root}")  # fmt: skip


if __name__ == "__main__":
    main()
