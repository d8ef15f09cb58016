"""Checkpoint files: named by position, written atomically, sealed with a checksum.

This package's public face is the file API of :mod:`ddpkit.checkpoint.files`, re-exported
here (``ddpkit.checkpoint.load_checkpoint`` and friends), :func:`checkpoint_folder`, a run's
checkpoints in a folder or an object store (``s3://...``), and :func:`export_checkpoint`, the
offline tool that writes a checkpoint's model weights as one file (``ddpkit export``).
Sharded FSDP checkpoints (:mod:`ddpkit.checkpoint.sharded`, torch's DCP) are imported only
when an FSDP model is saved or resumed, so importing this package stays cheap.

Example:
    >>> import tempfile, torch
    >>> folder = tempfile.mkdtemp()
    >>> _ = save_checkpoint({"epoch": 1, "w": torch.zeros(1)}, folder, epoch=1)
    >>> parse_name(latest_checkpoint(folder).name)
    Position(epoch=1, step=None)
"""

from ddpkit.checkpoint.export import ExportResult, export_checkpoint
from ddpkit.checkpoint.files import (
    Position,
    checkpoint_name,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    parse_name,
    prune_checkpoints,
    save_checkpoint,
)
from ddpkit.checkpoint.redirect import resolve_checkpoint_dir
from ddpkit.checkpoint.storage import CheckpointFolder, checkpoint_folder

# What users call: the file API, a run's folder, the export tool, and the folder a tool may
# redirect checkpoints to (examples/imagenet.py).
__all__ = [
    "CheckpointFolder",
    "ExportResult",
    "Position",
    "checkpoint_folder",
    "checkpoint_name",
    "export_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "parse_name",
    "prune_checkpoints",
    "resolve_checkpoint_dir",
    "save_checkpoint",
]
