"""What ddpkit reaches for inside torch's elastic launcher: the queue in which a function
worker's wrapper (``torch.distributed.elastic.multiprocessing.api._wrap``) puts the rank's
result, which torch offers no handle to.

Example::

    queue = function_worker_result_queue()   # None: not found
"""

from __future__ import annotations

from typing import Any

from ddpkit._compat import Internal
from ddpkit._compat.python import caller_frame

RESULT_QUEUE = Internal(
    "the ret_vals and local_rank of torch.distributed.elastic.multiprocessing.api._wrap",
    "torch",
    "os._exit(0) called on a thread other than the main one leaves torch's agent waiting "
    "for that rank's result, as under torch's own --run-path",
)  # fmt: skip


def function_worker_result_queue() -> Any | None:
    """The queue torch's function-worker wrapper reads this rank's result from (a caller
    of the caller of this function); None, said once, where it is not found.

    Example::

        queue = function_worker_result_queue()
        if queue is not None: queue.put(None)   # the result a return would have given
    """
    RESULT_QUEUE.used()
    frame: Any = caller_frame(1)
    while frame is not None:
        results, rank = frame.f_locals.get("ret_vals"), frame.f_locals.get("local_rank")
        if isinstance(results, dict) and rank in results:
            return results[rank]
        frame = frame.f_back
    RESULT_QUEUE.gone()
    return None
