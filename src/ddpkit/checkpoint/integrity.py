"""A checksum of a checkpoint's contents, stored inside it and checked after it is loaded.

``torch.load`` notices a truncated file (the zip directory at its end is missing) but not
flipped bits inside a tensor: it loads them as numbers. The digest covers every key, every
tensor's dtype, shape and bytes, and every plain value, in order, so any change to what was
saved shows as a mismatch. It needs nothing but the loaded dict to check, so the checkpoint
stays one file that plain ``torch.load`` reads.

Example:
    >>> import torch
    >>> sealed = seal({"epoch": 3, "w": torch.ones(2)})
    >>> sealed[SEAL_KEY]["scheme"]
    'ddpkit-content-sha256/1'
    >>> verify_seal(sealed)
    'intact'
    >>> sealed["w"][0] = 2.0
    >>> verify_seal(sealed)
    'mismatch'
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from typing import Any

import torch

SEAL_KEY = "integrity"
SCHEME = "ddpkit-content-sha256/1"


def seal(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` plus its digest under :data:`SEAL_KEY` (a new dict; ``state`` is unchanged).

    Example:
        >>> sorted(seal({"epoch": 1}))
        ['epoch', 'integrity']
    """
    contents = {k: v for k, v in state.items() if k != SEAL_KEY}
    return {**contents, SEAL_KEY: {"scheme": SCHEME, "sha256": content_digest(contents)}}


def verify_seal(state: Mapping[str, Any]) -> str:
    """``'intact'``, ``'mismatch'``, or ``'unsealed'`` (written without a digest).

    Example:
        >>> verify_seal({"epoch": 1})
        'unsealed'
    """
    recorded = state.get(SEAL_KEY)
    if not isinstance(recorded, Mapping) or recorded.get("scheme") != SCHEME:
        return "unsealed"
    contents = {k: v for k, v in state.items() if k != SEAL_KEY}
    return "intact" if content_digest(contents) == recorded.get("sha256") else "mismatch"


def content_digest(value: Any) -> str:
    """SHA-256 over ``value``'s structure and contents (tensors by dtype, shape and bytes).

    Example:
        >>> content_digest({"a": 1}) == content_digest({"a": 1})
        True
        >>> content_digest([1, 2]) == content_digest((1, 2))
        False
    """
    hasher = hashlib.sha256()
    _feed(hasher, value)
    return hasher.hexdigest()


def file_digest(path: Any, chunk_bytes: int = 1 << 22) -> str:
    """SHA-256 of a file's bytes, read in chunks (for the files of sharded checkpoints).

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "f"; _ = p.write_bytes(b"abc")
        >>> file_digest(p)[:12]
        'ba7816bf8f01'
    """
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            hasher.update(chunk)
    return hasher.hexdigest()


def _feed(hasher: Any, value: Any) -> None:
    # Each value is tagged with its kind and length, so [1, 2] and [12] cannot collide.
    if isinstance(value, torch.Tensor):
        _feed_tensor(hasher, value)
    elif isinstance(value, Mapping):
        hasher.update(b"d%d;" % len(value))
        for key, item in value.items():
            _feed(hasher, key)
            _feed(hasher, item)
    elif isinstance(value, (list, tuple)):
        hasher.update(b"%s%d;" % (b"l" if isinstance(value, list) else b"t", len(value)))
        for item in value:
            _feed(hasher, item)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        # A class the user allowed (add_safe_globals): its attributes, not its repr, which
        # may hold a memory address.
        hasher.update(f"o{type(value).__qualname__};".encode())
        _feed(hasher, vars(value))
    else:
        _feed_scalar(hasher, value)


def _feed_scalar(hasher: Any, value: Any) -> None:
    if value is None or isinstance(value, bool):
        data = f"{value}".encode()
    elif isinstance(value, int):
        data = b"i" + str(value).encode()
    elif isinstance(value, float):
        data = b"f" + struct.pack("<d", value)
    elif isinstance(value, (str, bytes)):
        data = b"s" + (value.encode() if isinstance(value, str) else value)
    else:  # dtypes, devices: their type and text
        data = f"o{type(value).__qualname__}:{value}".encode()
    hasher.update(b"%d:" % len(data) + data)


def _feed_tensor(hasher: Any, tensor: torch.Tensor) -> None:
    tensor = tensor.detach()
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    if tensor.is_quantized:
        tensor = tensor.int_repr()
    hasher.update(f"T{tensor.dtype}{list(tensor.shape)};".encode())
    flat = tensor.cpu().contiguous().reshape(-1).view(torch.uint8)
    hasher.update(flat.numpy())
