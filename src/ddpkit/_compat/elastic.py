"""What ddpkit reaches for inside torch's elastic launcher: the queue in which a function
worker's wrapper (``torch.distributed.elastic.multiprocessing.api._wrap``) puts the rank's
result, which torch offers no handle to; and the function workers' poll, which reports one
failed worker where several ended (:func:`report_every_failure`).

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


EVERY_FAILURE = Internal(
    "torch.distributed.elastic.multiprocessing.api.MultiprocessContext._poll and ._pc",
    "torch",
    "when two warm workers end at once, only the first in rank order is reported (a rank that "
    "died without a record can then be missed as the cause)",
)  # fmt: skip


def report_every_failure() -> None:
    """Make torch's function-worker context report every worker that ended badly, as its
    subprocess context does (warm workers are function workers).

    torch's ``MultiprocessContext`` reports one failed worker: the first, in rank order, of
    those it finds ended at its check. When rank 1 dies without a record (``os._exit``, a
    crash in native code) and rank 0 fails on the lost peer before the check, only rank 0 was
    reported, and it was blamed. With this, the workers that had ended by then are reported
    too, with their exit codes; ddpkit's blame order picks the cause. Installed once.

    Example::

        report_every_failure()   # before elastic_launch
    """
    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    context = getattr(api, "MultiprocessContext", None)
    poll = getattr(context, "_poll", None)
    if context is None or poll is None:
        EVERY_FAILURE.gone()
        return
    if getattr(poll, "ddpkit_every_failure", False):
        return
    EVERY_FAILURE.used()

    def _poll(self: Any) -> Any:
        result = poll(self)
        if result is not None and result.failures:
            _add_ended(self, result.failures, ProcessFailure)
        return result

    _poll.ddpkit_every_failure = True  # type: ignore[attr-defined]
    context._poll = _poll


def _add_ended(context: Any, failures: dict[int, Any], failure: Any) -> None:
    """The other workers that ended with a non-zero code (torch had just stopped the rest)."""
    processes = getattr(getattr(context, "_pc", None), "processes", None) or []
    for rank, process in enumerate(processes):
        code = process.exitcode
        if rank in failures or code in (None, 0):
            continue
        failures[rank] = failure(local_rank=rank, pid=process.pid, exitcode=code,
                                 error_file=context.error_files[rank])  # fmt: skip
