"""A rank's peak memory since the last reset: CUDA's max allocated on a GPU, resident set on CPU.

On a GPU it is what the caching allocator handed out at most (``torch.cuda.max_memory_
allocated``), the figure an out-of-memory error is about. On CPU it is the process's peak
resident set size (Linux's ``VmHWM``), which writing ``5`` to ``/proc/self/clear_refs`` resets,
so each epoch has its own peak; where that cannot be reset (another system), the peak since
the process started.

Example:
    >>> import torch
    >>> reset_peak_memory(torch.device("cpu"))
    >>> peak_memory_bytes(torch.device("cpu")) > 0
    True
"""

from __future__ import annotations

import contextlib
import resource
import sys
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def peak_memory_bytes(device: torch.device) -> int:
    """The process's peak memory on ``device`` since :func:`reset_peak_memory`, in bytes.

    Example:
        >>> peak_memory_bytes(torch.device("cpu")) > 1_000_000
        True
    """
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return _peak_resident_bytes()


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak (on CPU only where Linux allows it; elsewhere nothing changes).

    Example:
        >>> reset_peak_memory(torch.device("cpu"))
    """
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    # Not Linux, or not allowed: the peak since the process started is still true.
    with contextlib.suppress(OSError):
        _CLEAR_REFS.write_text("5")


def _peak_resident_bytes() -> int:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS: bytes; Linux: kB
