"""The tutorials' ImageNet command, built on ddpkit: a ResNet trained on an image folder.

    python examples/make_image_folder.py --classes 10 --per-class 50 --size 64 data/tiny

    # the tutorial's command: one process per GPU, or --nproc-per-node processes on CPU
    python examples/imagenet.py data/tiny --arch resnet18 --dist-url file:///tmp/pg \\
        --dist-backend gloo --world-size 1 --multiprocessing-distributed --rank 0 \\
        --nproc-per-node 2 --image-size 64 --epochs 5 -b 64

    # the same job through ddpkit's launcher
    ddpkit run --nproc 2 examples/imagenet.py data/tiny --arch resnet18 --image-size 64 \\
        --epochs 5 -b 64 --checkpoint-dir runs/imagenet-run

The flags mean what they mean in PyTorch's examples/imagenet/main.py. With
--multiprocessing-distributed, --world-size is the number of nodes and --rank this node's
index, and the script starts one process per GPU (--nproc-per-node on CPU) through ddpkit's
launcher; --dist-url and --dist-backend say how the processes meet (file:// or tcp://; for
several nodes a tcp:// URL on node 0, where the nodes' launchers meet at its port + 1).
Without it, --world-size and --rank are those of this one process, or come from `ddpkit run`
/ torchrun. -b/--batch-size and -j/--workers are per node, split over its processes. Training
is SGD with momentum and weight decay, the learning rate divided by 10 every 30 epochs;
validation reports top-1 and top-5 accuracy over the whole val split, as " * Acc@1 ... Acc@5".
A checkpoint is written every epoch to --checkpoint-dir; --resume continues from there, and
with --evaluate only evaluates. On GPUs the model runs in bf16 autocast and channels_last.
Images: torchvision's ImageFolder and transforms when installed, else examples/imagefolder.py;
models: torchvision's resnet18/34/50, else examples/resnet.py (same names and shapes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import default_collate

import ddpkit
from ddpkit.checkpoint import latest_checkpoint, list_checkpoints, resolve_checkpoint_dir
from ddpkit.env.initmethod import parse_init_method
from imagefolder import SyntheticImages, check_layout, image_folders, torchvision
from resnet import ARCHS, resnet

LIBRARY = (
    f"torchvision {torchvision.__version__}"
    if torchvision is not None
    else "Pillow and examples/resnet.py (torchvision is not installed)"
)
DUMMY_TRAIN, DUMMY_VAL, DUMMY_CLASSES = 1280, 256, 1000  # --dummy: ImageNet's 1000 classes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "data", nargs="?", help="folder with train/ and val/ (one folder per class)"
    )
    parser.add_argument("-a", "--arch", default="resnet18", choices=ARCHS)
    parser.add_argument("-j", "--workers", type=int, default=4, help="loader processes per node")
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument(
        "-b", "--batch-size", type=int, default=256, help="images per step per node"
    )
    parser.add_argument("--lr", "--learning-rate", type=float, default=0.1, dest="lr")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--wd", "--weight-decay", type=float, default=1e-4, dest="weight_decay")
    parser.add_argument("-p", "--print-freq", type=int, default=10, help="log every N steps")
    parser.add_argument(
        "--resume", metavar="PATH", help="continue the run in this checkpoint folder"
    )
    parser.add_argument("-e", "--evaluate", action="store_true", help="only evaluate on val")
    parser.add_argument("--world-size", type=int, default=-1, help="nodes (processes without -m)")
    parser.add_argument("--rank", type=int, default=-1, help="node rank (process rank without -m)")
    parser.add_argument("--dist-url", default=None, help="file:///PATH or tcp://HOST:PORT")
    parser.add_argument("--dist-backend", default=None, choices=["gloo", "nccl"])
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("-m", "--multiprocessing-distributed", action="store_true")
    parser.add_argument("--dummy", action="store_true", help="synthetic images, no folder read")
    extra = parser.add_argument_group("ddpkit's additions")
    extra.add_argument(
        "--nproc-per-node", type=int, default=None, help="default: one per GPU, or 1"
    )
    extra.add_argument("--image-size", type=int, default=224, help="crop size in pixels")
    extra.add_argument("--checkpoint-dir", default="runs/imagenet")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    problems = setup_problems(args)
    if problems:
        sys.exit("imagenet.py: error: " + "\n  ".join(problems))
    if not args.multiprocessing_distributed:
        main_worker(args)  # one process, or one of the workers of `ddpkit run` / torchrun
        return
    nodes = max(1, args.world_size)
    try:
        ddpkit.spawn(main_worker, processes_per_node(args), args, nnodes=nodes,
                     node_rank=max(0, args.rank), master=launchers_meet_at(args))  # fmt: skip
    except ddpkit.DdpkitError as err:  # a worker failed (its traceback is in the message)
        print(f"imagenet.py: {err}", file=sys.stderr)
        sys.exit(max(1, getattr(err, "exitcode", 1)))


def setup_problems(args: argparse.Namespace) -> list[str]:
    """Everything wrong with the command line and the data, found before any process starts."""
    problems = []
    if not args.dummy:
        problems += check_layout(args.data) if args.data else ["give the image folder, or --dummy"]
    problems += checkpoint_problems(args)
    if args.multiprocessing_distributed and args.world_size > 1:
        if not 0 <= args.rank < args.world_size:
            problems.append(f"--rank {args.rank} must be a node index in 0..{args.world_size - 1}")
        if not (args.dist_url or "").startswith("tcp://"):
            problems.append("several nodes need --dist-url tcp://HOST:PORT on node 0")
    return problems


def checkpoint_problems(args: argparse.Namespace) -> list[str]:
    folder = checkpoint_folder(args)
    if args.resume is None:
        if list_checkpoints(folder) and not args.evaluate:
            return [f"{folder} holds checkpoints of an earlier run: --resume {folder} continues "
                    "it, or pass another --checkpoint-dir"]  # fmt: skip
        return []
    if not Path(args.resume).exists():
        return [f"--resume {args.resume} does not exist"]
    newest = latest_checkpoint(folder)
    if Path(args.resume).is_file() and newest is not None and newest != Path(args.resume):
        return [f"--resume {args.resume}: {folder} has a newer checkpoint, {newest.name}; ddpkit "
                "continues from the newest, so pass the folder"]  # fmt: skip
    return []


def checkpoint_folder(args: argparse.Namespace) -> Path:
    """The run's folder, where `ddpkit verify` / `bench` / `doctor --run` really put it."""
    if args.resume is None:
        return resolve_checkpoint_dir(args.checkpoint_dir)
    folder = Path(args.resume) if Path(args.resume).is_dir() else Path(args.resume).parent
    return resolve_checkpoint_dir(folder)


def processes_per_node(args: argparse.Namespace) -> int:
    return args.nproc_per_node or torch.cuda.device_count() or 1


def launchers_meet_at(args: argparse.Namespace) -> str | None:
    """Where the nodes' launchers meet: the port after --dist-url's (whose port is the
    process group's). None on one node."""
    if max(1, args.world_size) == 1:
        return None
    method = parse_init_method(args.dist_url)
    return f"{method.host}:{int(method.port or 0) + 1}"


def main_worker(args: argparse.Namespace) -> None:
    """One training process: join, build, train (or evaluate), report."""
    world = join(args)
    ddpkit.print0(f"images and models: {LIBRARY}")
    train_set, val_set, classes = datasets(args)
    model = build_model(args.arch, classes, world)
    trainer = make_trainer(args, model, world)
    train, val = loaders(args, train_set, val_set, world)
    if args.evaluate:
        if not trainer.resume():
            ddpkit.print0(f"no checkpoint in {checkpoint_folder(args)}: evaluating untrained")
        report({f"val_{k}": v for k, v in trainer.evaluate(val).items()}, classes)
        return
    history = trainer.fit(train, epochs=args.epochs, val=val)
    seconds = sum(epoch["time_s"] for epoch in history)
    ddpkit.print0(f"trained {len(history)} epoch(s) on {world.world_size} process(es) "
                  f"in {seconds:.1f} s of training")  # fmt: skip
    report(history[-1], classes)


def join(args: argparse.Namespace) -> ddpkit.World:
    """The tutorial's meaning of --world-size/--rank/--dist-url, through ddpkit.init."""
    if not args.multiprocessing_distributed and args.world_size > 1:  # started by hand
        return ddpkit.init(args.dist_backend, init_method=args.dist_url or "env://",
                           rank=args.rank, world_size=args.world_size, seed=args.seed)  # fmt: skip
    # One process, or a worker whose launcher gave it its rank (--dist-url: where to meet).
    return ddpkit.init(args.dist_backend, init_method=args.dist_url, seed=args.seed)


def datasets(args: argparse.Namespace) -> tuple[Any, Any, int]:
    if args.dummy:
        train = SyntheticImages(DUMMY_TRAIN, args.image_size, DUMMY_CLASSES, seed=1)
        return train, SyntheticImages(DUMMY_VAL, args.image_size, DUMMY_CLASSES, seed=2), 1000
    train, val, classes = image_folders(args.data, args.image_size)
    return train, val, len(classes)


def build_model(arch: str, classes: int, world: ddpkit.World) -> torch.nn.Module:
    if torchvision is not None:
        model = getattr(torchvision.models, arch)(num_classes=classes)
    else:
        model = resnet(arch, classes)
    if world.device.type == "cuda":  # tensor cores prefer NHWC
        model = model.to(memory_format=torch.channels_last)
    return ddpkit.prepare_model(model)


def make_trainer(args: argparse.Namespace, model: Any, world: ddpkit.World) -> ddpkit.Trainer:
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)  # fmt: skip
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    on_gpu = world.device.type == "cuda" and torch.cuda.is_bf16_supported()
    return ddpkit.Trainer(
        model, optimizer, F.cross_entropy, checkpoint_folder(args), save_every=1,
        scheduler=scheduler, scheduler_interval="epoch",
        precision="bf16" if on_gpu else "fp32", log_every=args.print_freq,
    )  # fmt: skip


def loaders(args: argparse.Namespace, train: Any, val: Any, world: ddpkit.World) -> tuple:
    """-b and -j are per node, as in the tutorial's script: split over this node's processes."""
    share = world.local_world_size
    per_process = max(1, args.batch_size // share)
    workers = (args.workers + share - 1) // share
    options: dict[str, Any] = {"num_workers": workers, "persistent_workers": workers > 0}
    if world.device.type == "cuda":
        options["collate_fn"] = channels_last_batch
    return (ddpkit.prepare_loader(train, per_process, shuffle=True, **options),
            ddpkit.prepare_loader(val, per_process, shuffle=False, **options))  # fmt: skip


def channels_last_batch(samples: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    images, targets = default_collate(samples)
    return images.contiguous(memory_format=torch.channels_last), targets


def report(metrics: dict[str, float], classes: int) -> None:
    """The tutorial's summary line, from rank 0: ' * Acc@1 71.234 Acc@5 90.123'."""
    top1 = f"{100 * metrics['val_accuracy']:.3f}"
    top5 = metrics.get("val_top5_accuracy")
    shown = f"{100 * top5:.3f}" if top5 is not None else f"n/a ({classes} classes)"
    ddpkit.print0(f" * Acc@1 {top1} Acc@5 {shown}  (val loss {metrics['val_loss']:.4f})")


if __name__ == "__main__":
    main()
