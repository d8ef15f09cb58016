"""``all_gather``: every rank's tensor, concatenated in rank order; first dimensions may differ.

torch's ``all_gather`` needs equal shapes on every rank and hangs or fails obscurely when
they differ. Here each rank first says its shape and dtype: the first dimension may differ
(rows are padded for the exchange and cut back), anything else that differs stops every rank
with an error naming the ranks and their shapes. In a world of one the tensor comes back as
it is.

Example:
    >>> import torch
    >>> all_gather(torch.tensor([[1, 2], [3, 4]]))
    tensor([[1, 2],
            [3, 4]])
"""

from __future__ import annotations

import torch

from ddpkit.errors import ConfigError
from ddpkit.runtime.collectives import all_gather_rows, describe_tensor

_MAX_DIMS = 8
_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
]  # fmt: skip


def all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension, rank 0's first.

    A 0-dimensional tensor counts as one row. A collective: every rank calls it.

    Example:
        >>> import torch
        >>> all_gather(torch.tensor(3.0))
        tensor([3.])
    """
    rows = tensor.reshape(1) if tensor.dim() == 0 else tensor
    _check_same_layout(rows)
    return torch.cat(all_gather_rows(rows))


def _check_same_layout(rows: torch.Tensor) -> None:
    """Every rank's dtype and shape beyond the first dimension agree, or a clear error."""
    if rows.dim() > _MAX_DIMS or rows.dtype not in _DTYPES:
        raise ConfigError(f"all_gather handles up to {_MAX_DIMS} dimensions of a plain dtype; "
                          f"got {describe_tensor(rows)}")  # fmt: skip
    layout = torch.full((1, _MAX_DIMS + 1), -1, dtype=torch.int64)
    layout[0, 0] = _DTYPES.index(rows.dtype)
    layout[0, 1 : rows.dim()] = torch.tensor(rows.shape[1:], dtype=torch.int64)
    layouts = torch.cat(all_gather_rows(layout)).tolist()
    if any(other != layouts[0] for other in layouts):
        shapes = "; ".join(f"rank {rank}: {_describe(row)}" for rank, row in enumerate(layouts))
        raise ConfigError(
            "all_gather needs the same dtype and the same shape beyond the first dimension "
            f"on every rank; got {shapes}"
        )


def _describe(layout: list[int]) -> str:
    dtype = str(_DTYPES[layout[0]]).removeprefix("torch.")
    rest = [str(n) for n in layout[1:] if n >= 0]
    return f"{dtype}[N{''.join(', ' + n for n in rest)}]"
