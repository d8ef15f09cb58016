"""``ddpkit export``: write a checkpoint's model weights to one file loadable without ddpkit.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(); add_arguments(parser)
    >>> parser.parse_args(["runs/gpt", "gpt.safetensors"]).out
    'gpt.safetensors'
"""

from __future__ import annotations

import argparse

from ddpkit._core.log import command_logger
from ddpkit.checkpoint.export import FORMATS, export_checkpoint

HELP = "write a checkpoint's model weights to one .pt or .safetensors file"
DESCRIPTION = (
    "Read a ddpkit checkpoint (whole or FSDP/HSDP shards, on disk or in an object store), "
    "check its checksums, and write the model's state dict to one file that torch.load "
    "(weights_only=True) or safetensors reads without ddpkit."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The checkpoint to read and the file to write.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> parser.parse_args(["runs/x/epoch_000002.dcp", "m.pt"]).source
        'runs/x/epoch_000002.dcp'
    """
    parser.add_argument(
        "source", help="a checkpoint (epoch_*.pt, epoch_*.dcp), or a folder or URL: its newest"
    )
    parser.add_argument(
        "out", help=f"the file to write; its suffix picks the format ({', '.join(FORMATS)})"
    )


def main(args: argparse.Namespace) -> int:
    """Export and say what was written.

    Example::

        main(parser.parse_args(["runs/gpt", "gpt.pt"]))   # 0
    """
    result = export_checkpoint(args.source, args.out)
    command_logger("export").info(
        f"exported {result.tensors} tensors ({result.bytes / 2**20:.1f} MiB) from "
        f"{result.source} to {result.path}, checksums verified; sha256 {result.sha256}"
    )
    return 0
