"""The GPU tier's markers: a test names how many CUDA GPUs it needs and is skipped, with the
count it found, on a machine with fewer (every CPU-only machine, CI included)."""

from __future__ import annotations

import pytest
import torch


def visible_gpus() -> int:
    """CUDA GPUs this process can see (asking does not initialise CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def needs_gpus(count: int) -> list[pytest.MarkDecorator]:
    """``pytestmark = needs_gpus(1)``: the ``gpu`` marker, and a skip below ``count`` GPUs."""
    found = visible_gpus()
    reason = f"needs {count} CUDA GPU{'s' if count > 1 else ''}; {found} visible"
    return [pytest.mark.gpu, pytest.mark.skipif(found < count, reason=reason)]
