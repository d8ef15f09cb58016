"""Asynchronous checkpoints: a copy of the state taken on the training path, written in a thread.

Training stops only for :func:`snapshot`, a copy of the state in CPU memory (from a GPU into
pinned memory): every tensor cloned, every dict and list rebuilt, so the optimizer steps that
follow cannot change what is being written. A :class:`BackgroundWriter` then seals and writes
that copy in a thread with the same steps as a synchronous save (SHA-256 seal, a temporary
file, fsync, an atomic rename, then pruning), so everything a synchronous save guarantees
holds the moment the file appears; before that moment the newest checkpoint is the previous
one, and a ``kill -9`` leaves only a temporary file the next resume removes.

At most one write is in flight: the next save (and the end of training, and a stop) waits for
it and says how long it waited. A write that failed is raised at that next wait. The cost is
memory: one more copy of the checkpointed state while it is written.

Example:
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> state = {"w": torch.ones(2), "groups": [{"lr": 0.1}]}
    >>> frozen = snapshot(state)
    >>> state["w"].add_(1); state["groups"][0]["lr"] = 0.2
    tensor([2., 2.])
    >>> frozen["w"], frozen["groups"][0]["lr"]
    (tensor([1., 1.]), 0.1)
    >>> writer = BackgroundWriter()
    >>> target = Path(tempfile.mkdtemp()) / "a.txt"
    >>> writer.submit(lambda: target.write_text("done"), "a.txt")
    0.0
    >>> writer.wait() >= 0, target.read_text()
    (True, 'done')
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ddpkit.errors import CheckpointError
from ddpkit.runtime.tensortree import map_tensors, tensor_bytes


def snapshot(value: Any) -> Any:
    """``value`` with every tensor copied to CPU memory and every container rebuilt.

    Example:
        >>> snapshot({"a": (torch.zeros(1), 3)})
        {'a': (tensor([0.]), 3)}
    """
    return _sized_snapshot(value)[0]


def _sized_snapshot(value: Any) -> tuple[Any, int]:
    """:func:`snapshot`, and the bytes it copied: counted on the way, one walk, not two."""
    copier = _TensorCopier()
    copied = map_tensors(value, copier)
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # the device-to-host copies were queued without waiting
    return copied, copier.copied_bytes


class _TensorCopier:
    """Copies one tensor to CPU memory (pinned, from a GPU) and counts the bytes copied."""

    def __init__(self) -> None:
        self.copied_bytes = 0

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach()
        self.copied_bytes += tensor_bytes(tensor)
        if tensor.device.type != "cuda":
            return tensor.clone()
        host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
        return host.copy_(tensor, non_blocking=True)


_writing: set[threading.Thread] = set()  # every write in flight in this process


def wait_for_writes() -> None:
    """Wait for every checkpoint this process is writing in the background (a resume does,
    so a run started again in the same process, after an exception, never reads or cleans
    up a folder while a write into it is in flight).

    Example:
        >>> wait_for_writes()
    """
    for thread in list(_writing):
        thread.join()


class BackgroundWriter:
    """Runs one checkpoint write at a time in a thread.

    Example::

        writer = BackgroundWriter()
        writer.submit(lambda: save_checkpoint(frozen, folder, epoch=3), "epoch_000003.pt")
        writer.wait()   # before the process ends
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._what = ""

    @property
    def busy(self) -> bool:
        """A write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, write: Callable[[], Any], what: str) -> float:
        """Start ``write`` in the background once the write in flight (if any) is done;
        returns the seconds waited for it."""
        waited = self.wait()
        self._what, self._error = what, None
        self._thread = threading.Thread(target=self._run, args=(write,), name="ddpkit-save")
        _writing.add(self._thread)
        self._thread.start()
        return waited

    def submit_copy(self, state: Any, write: Callable[[Any], Any], what: str) -> tuple[float, int]:
        """Copy ``state`` (:func:`snapshot`: training goes on once it is taken), then start
        ``write(copy)`` as :meth:`submit` does; the seconds waited for the previous write and
        the copy's bytes.

        Example::

            waited, size = writer.submit_copy(state, lambda copy: store.write(name, copy), name)
        """
        frozen, size = _sized_snapshot(state)
        return self.submit(lambda: write(frozen), what), size

    def wait(self) -> float:
        """Wait for the write in flight; the seconds waited. Raises if it failed."""
        if self._thread is None:
            return 0.0
        start = time.perf_counter()
        self._thread.join()
        self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"writing {self._what} in the background failed: {error}")
        return time.perf_counter() - start

    def _run(self, write: Callable[[], Any]) -> None:
        try:
            write()
        except BaseException as err:  # raised in the training thread at the next wait
            self._error = err
        finally:
            _writing.discard(threading.current_thread())
