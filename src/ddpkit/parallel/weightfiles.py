"""Weights files read one tensor, or one shard, at a time: ``.safetensors``, ``torch.save``'d
state dicts, and Hugging Face folders of shards.

:class:`WeightFile` opens a file or a folder and hands out tensors by name; a safetensors
file is memory-mapped (``safe_open``), a ``.pt`` one loaded with ``mmap=True`` and
``weights_only=True``. For a sharded model, :class:`SafetensorsRows` reads a range of a
tensor's rows with plain file reads straight into a rank's shard, so a rank's memory holds
its shards and nothing of the file.

Example::

    with WeightFile.open("gpt.safetensors") as weights:
        weights.get("head.weight").shape
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from ddpkit.errors import ConfigError

TORCH_SUFFIXES = (".pt", ".pth", ".bin")


class WeightFile:
    """The tensors of a weights file (or folder), read one at a time.

    Example::

        with WeightFile.open("gpt.safetensors") as weights:
            weights.get("head.weight").shape
    """

    def __init__(self, where: Path, readers: dict[str, Any], stack: ExitStack) -> None:
        self.where, self._readers, self._stack = where, readers, stack
        self._rows: dict[str, SafetensorsRows] = {}

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> WeightFile:
        """Open ``path`` (a file, or a folder of them); a ConfigError if it holds none."""
        where, stack = Path(path), ExitStack()
        opened = cls(where, {}, stack)
        for file in _weight_files(where):
            reader = _open_one(file, stack)
            opened._readers.update(dict.fromkeys(reader.keys(), reader))
            if file.suffix == ".safetensors":
                rows = SafetensorsRows(file)
                opened._rows.update(dict.fromkeys(rows.entries, rows))
        return opened

    def __enter__(self) -> WeightFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def names(self) -> set[str]:
        return set(self._readers)

    def get(self, name: str) -> torch.Tensor:
        return self._readers[name].get_tensor(name)  # type: ignore[no-any-return]

    def read_rows_into(self, name: str, start: int, dest: torch.Tensor) -> bool:
        """Read rows ``start:start + len(dest)`` of ``name`` straight into ``dest``, where
        the file allows it (a .safetensors file of dest's dtype); False where it does not."""
        rows = self._rows.get(name)
        return rows is not None and rows.read_into(name, start, dest)


def _weight_files(where: Path) -> list[Path]:
    if where.is_file():
        return [where]
    if not where.is_dir():
        raise ConfigError(f"weights {where} does not exist")
    index = where / "model.safetensors.index.json"
    if index.is_file():
        return sorted({where / f for f in json.loads(index.read_text())["weight_map"].values()})
    found = sorted(where.glob("*.safetensors")) or sorted(
        f for f in where.iterdir() if f.suffix in TORCH_SUFFIXES
    )
    if not found:
        raise ConfigError(f"weights folder {where} holds no .safetensors, .pt or .bin file")
    return found


def _open_one(file: Path, stack: ExitStack) -> Any:
    if file.suffix == ".safetensors":
        try:
            from safetensors import safe_open
        except ImportError:
            raise ConfigError(
                f"reading {file} needs the safetensors package: pip install 'ddpkit[export]'"
            ) from None
        return stack.enter_context(safe_open(str(file), framework="pt"))
    if file.suffix in TORCH_SUFFIXES:
        return _TorchFile(file)
    raise ConfigError(f"weights {file}: use a .safetensors, .pt, .pth or .bin file")


class _TorchFile:
    """A ``torch.save``'d state dict, memory-mapped: a tensor costs memory when read."""

    def __init__(self, file: Path) -> None:
        try:
            state = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
        except Exception as err:
            raise ConfigError(f"weights {file} could not be read safely: {err}") from err
        if isinstance(state, dict) and isinstance(state.get("model"), dict):
            state = state["model"]  # a ddpkit checkpoint: its model
        if not isinstance(state, dict):
            raise ConfigError(f"weights {file} holds a {type(state).__name__}, not a state dict")
        self._tensors = {k: v for k, v in state.items() if torch.is_tensor(v)}

    def keys(self) -> Iterator[str]:
        return iter(self._tensors)

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._tensors[name]


_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


class SafetensorsRows:
    """Rows of the tensors of a .safetensors file, read with plain file reads into memory
    the caller owns. The format is a little-endian u64 header length, a JSON header giving
    each tensor's dtype, shape and byte range, then the data: a range of rows of a tensor is
    a range of bytes.

    Example::

        SafetensorsRows("gpt.safetensors").read_into("head.weight", 128, shard)
    """

    def __init__(self, file: Path) -> None:
        self.file = file
        with file.open("rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(length))
        self.data_start = 8 + length
        self.entries = {k: v for k, v in header.items() if k != "__metadata__"}

    def read_into(self, name: str, start: int, dest: torch.Tensor) -> bool:
        entry = self.entries[name]
        if _DTYPES.get(entry["dtype"]) != dest.dtype or not entry["shape"]:
            return False
        row_bytes = dest.element_size() * math.prod(entry["shape"][1:])
        first, end = entry["data_offsets"]
        offset = self.data_start + first + start * row_bytes
        wanted = dest.numel() * dest.element_size()
        if offset + wanted > self.data_start + end:
            return False
        buffer = dest.view(-1).view(torch.uint8).numpy()
        with self.file.open("rb", buffering=0) as handle:
            handle.seek(offset)
            if handle.readinto(buffer.data) != wanted:
                raise ConfigError(f"weights {self.file} ends inside {name}: a partial copy?")
        return True
