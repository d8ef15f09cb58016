"""This process's random number generators, as plain data a checkpoint can hold.

A resumed run must draw the same random numbers (dropout masks, augmentation) as the
uninterrupted one, so a checkpoint holds every rank's generators: Python's ``random``,
NumPy's global generator, torch's CPU generator and each initialized CUDA device's. Each
rank draws from its own stream (see :mod:`ddpkit.runtime.seeding`), so they are gathered from all
ranks when a checkpoint is written and each rank takes back its own. Everything is stored as
tensors, ints and floats, so ``torch.load(weights_only=True)`` reads it.

Example:
    >>> import torch
    >>> state = capture_rng()
    >>> a = torch.rand(1)
    >>> restore_rng(state)
    >>> bool(torch.rand(1) == a)
    True
"""

from __future__ import annotations

import array
import io
import random
from typing import Any

import torch

from ddpkit.runtime.collectives import all_gather_rows
from ddpkit.runtime.tensortree import map_tensors

try:  # NumPy is optional, as in ddpkit.runtime.seeding
    import numpy as np
except ImportError:  # pragma: no cover - numpy comes with most torch installs
    np = None  # type: ignore[assignment]


def capture_rng() -> dict[str, Any]:
    """The state of every generator this process uses, as plain data.

    Example:
        >>> sorted(capture_rng())
        ['numpy', 'python', 'torch']
    """
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "internal": _python_words(internal), "gauss": gauss},
        "torch": torch.get_rng_state(),
    }
    if np is not None:
        legacy = np.random.get_state(legacy=False)  # a dict: {"state": {"key", "pos"}, ...}
        state["numpy"] = {
            "key": torch.from_numpy(legacy["state"]["key"].astype(np.int64)),
            "pos": int(legacy["state"]["pos"]),
            "has_gauss": int(legacy["has_gauss"]),
            "gauss": float(legacy["gauss"]),
        }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


_last_python: list[Any] = [None, None]  # Python's generator's last words, and their tensor


def _python_words(internal: tuple[int, ...]) -> torch.Tensor:
    """Python's generator's 625 words as a tensor (read-only: the same one while they stay
    the same, as they do in most training steps, which draw from torch; a memory snapshot
    takes them every step). Through an array, 20 us; torch.tensor guesses each int's type."""
    if internal == _last_python[0]:
        return _last_python[1]  # type: ignore[no-any-return]
    words = torch.frombuffer(array.array("q", internal), dtype=torch.int64).clone()
    _last_python[:] = [internal, words]
    return words


def restore_rng(state: dict[str, Any]) -> None:
    """Put every generator back as :func:`capture_rng` found it.

    Example:
        >>> restore_rng(capture_rng())
    """
    python = state["python"]
    internal = tuple(int(x) for x in python["internal"].tolist())
    random.setstate((python["version"], internal, python["gauss"]))
    torch.set_rng_state(state["torch"].cpu())
    if np is not None and "numpy" in state:
        saved = state["numpy"]
        np.random.set_state(
            {
                "bit_generator": "MT19937",
                "state": {"key": saved["key"].numpy().astype(np.uint32), "pos": saved["pos"]},
                "has_gauss": saved["has_gauss"],
                "gauss": saved["gauss"],
            }
        )
    if "cuda" in state and torch.cuda.is_available():
        devices = state["cuda"][: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all([s.cpu() for s in devices])


def on_cpu(state: Any) -> Any:
    """``state`` with every tensor in it on the CPU, where generators take their state back.

    A whole checkpoint is read onto the rank's device, so on a GPU its random states arrive
    there too, and ``Generator.set_state`` takes only a CPU ``ByteTensor``.

    Example:
        >>> on_cpu({"rng": [torch.zeros(2, dtype=torch.uint8)], "host": "gpu7"})["host"]
        'gpu7'
    """
    return map_tensors(state, torch.Tensor.cpu)


def gather_from_ranks(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``state`` (plain data), by rank; a collective.

    Each state travels as the bytes ``torch.save`` makes of it and is read back with
    ``weights_only=True``: nothing is unpickled.

    Example:
        >>> gather_from_ranks({"torch": torch.zeros(2)})[0]["torch"]
        tensor([0., 0.])
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    mine = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    blobs = all_gather_rows(mine)
    return [torch.load(io.BytesIO(b.cpu().numpy().tobytes()), weights_only=True) for b in blobs]
