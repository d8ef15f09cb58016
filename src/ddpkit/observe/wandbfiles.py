"""What a Weights & Biases offline run already holds, read from its ``.wandb`` files.

An offline run resumed after a crash starts a new local folder and W&B's step counter from 0:
nothing tells the new process which steps the killed one wrote. ddpkit reads them here, so
a resumed job skips the points that are already there (every step once after ``wandb
sync``). The files are W&B's transaction log: LevelDB's log format (32 KiB blocks of
checksummed chunks) after a 7-byte header, each record one of W&B's protobuf ``Record``
messages, decoded with the ``wandb`` package's own definitions. A torn tail (a process killed
while writing) ends the scan where the last whole record ends.

Example:
    >>> from pathlib import Path
    >>> logged_steps(Path("/nonexistent"), "abc123")
    {}
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_HEADER = 7  # ":W&B", a 2-byte magic number, a version byte
_BLOCK = 32 * 1024
_CHUNK_HEADER = 7  # crc32 (4 bytes), length (2), type (1)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def offline_run_files(wandb_dir: Path, run_id: str) -> list[Path]:
    """The transaction logs of every offline folder of run ``run_id`` under ``wandb_dir``.

    Example:
        >>> offline_run_files(Path("/nonexistent"), "abc123")
        []
    """
    return sorted(wandb_dir.glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))


def logged_steps(wandb_dir: Path, run_id: str) -> dict[str, int]:
    """The highest step of each metric that the offline folders of ``run_id`` hold."""
    highest: dict[str, int] = {}
    for path in offline_run_files(wandb_dir, run_id):
        for step, row in history_rows(path):
            for key in row:
                highest[key] = max(highest.get(key, step), step)
    return highest


def logged_config(wandb_dir: Path, run_id: str) -> dict[str, Any]:
    """The config the offline folders of ``run_id`` hold, their updates applied in order (as
    ``wandb sync`` leaves the run); W&B's own keys (``_wandb``) left out.

    Example:
        >>> logged_config(Path("/nonexistent"), "abc123")
        {}
    """
    config: dict[str, Any] = {}
    for path in offline_run_files(wandb_dir, run_id):
        for record in _typed_records(path, "config"):
            config.update({_key(item): json.loads(item.value_json) for item in record.update})
    return {key: value for key, value in config.items() if not key.startswith("_")}


def history_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(step, {metric: value}) of every history row of one ``.wandb`` file, in order."""
    for history in _typed_records(path, "history"):
        row = {_key(item): json.loads(item.value_json) for item in history.item}
        step = row.pop("_step", None)
        if step is not None:
            yield int(step), {k: v for k, v in row.items() if not k.startswith("_")}


def _typed_records(path: Path, kind: str) -> Iterator[Any]:
    """The ``kind`` part (``history``, ``config``) of each record of that kind, in order."""
    from wandb.proto import wandb_internal_pb2

    for data in _records(path.read_bytes()):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == kind:
            yield getattr(record, kind)


def _key(item: Any) -> str:
    return str(item.key) if item.key else "/".join(item.nested_key)


def _records(data: bytes) -> Iterator[bytes]:
    """The whole records of a LevelDB-format log; stops at the first torn or corrupt chunk."""
    position, parts = _HEADER, b""
    while position + _CHUNK_HEADER <= len(data):
        room = _BLOCK - position % _BLOCK
        if room < _CHUNK_HEADER:  # a block's tail too short for a chunk is zero padding
            position += room
            continue
        checksum, length, kind = struct.unpack_from("<IHB", data, position)
        body = data[position + _CHUNK_HEADER : position + _CHUNK_HEADER + length]
        if len(body) < length or zlib.crc32(bytes([kind]) + body) != checksum:
            return
        position += _CHUNK_HEADER + length
        parts = body if kind in (_FULL, _FIRST) else parts + body
        if kind in (_FULL, _LAST):
            yield parts
