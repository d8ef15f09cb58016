"""torch's long error texts in brief, for the line a user reads first.

Example:
    >>> summarize_mismatch("RuntimeError: Connection closed by peer") is None
    True
"""

from __future__ import annotations

import re

_MISMATCH_CALL = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d+), "
    r"OpType=(\w+)(?:, TensorShape=\[([^\]]*)\], TensorDtypes=(\w+))?"
)


def summarize_mismatch(text: str) -> str | None:
    """torch's TORCH_DISTRIBUTED_DEBUG=DETAIL mismatch error in one line, or None.

    Example:
        >>> print(summarize_mismatch(
        ...     "Detected mismatch between collectives on ranks. Rank 0 is running collective: "
        ...     "CollectiveFingerPrint(SequenceNumber=4, OpType=ALLREDUCE, TensorShape=[3], "
        ...     "TensorDtypes=Float, ...), but Rank 1 is running collective: CollectiveFinger"
        ...     "Print(SequenceNumber=4, OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Float, "
        ...     "...).Collectives differ in the following aspects:   Tensor Tensor shapes: 3vs 4"))
        collective mismatch at call #4: rank 0 calls ALLREDUCE [3] Float,
        rank 1 calls ALLREDUCE [4] Float (shapes: 3vs 4)
    """
    if "Detected mismatch between collectives" not in text:
        return None
    found = _MISMATCH_CALL.findall(text)
    calls = [f"rank {r} calls {op}" + (f" [{shape}] {dtype}" if dtype else "")
             for r, _, op, shape, dtype in found]  # fmt: skip
    where = f" at call #{found[0][1]}" if found else ""
    _, _, aspects = text.partition("differ in the following aspects:")
    aspects = " ".join(aspects.replace("Tensor", "").split())
    return f"collective mismatch{where}: {', '.join(calls)}" + (f" ({aspects})" if aspects else "")
