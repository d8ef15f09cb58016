"""Typed errors. Each says what failed, with the numbers, and how to fix it.

Every error ddpkit raises on purpose derives from :class:`DdpkitError`, so a launcher or a
user's ``try`` block can tell a configuration mistake from a bug.

Example:
    >>> try:
    ...     raise ConfigError("--nproc must be >= 1 (got 0)")
    ... except DdpkitError as err:
    ...     print(err)
    --nproc must be >= 1 (got 0)
"""

from __future__ import annotations

from ddpkit._core.protocol import PREEMPTED_EXIT_CODE


class DdpkitError(Exception):
    """Base class of every error ddpkit raises on purpose.

    Example:
        >>> issubclass(ConfigError, DdpkitError)
        True
    """


class ConfigError(DdpkitError, ValueError):
    """A setting, flag or environment variable has a value that cannot work.

    Example:
        >>> raise ConfigError("WORLD_SIZE='two' is not an integer")
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: WORLD_SIZE='two' is not an integer
    """


class RemovedNameError(ConfigError, AttributeError):
    """A public name ddpkit removed, asked for: the error names what replaced it (an
    ``AttributeError`` too, so ``hasattr`` and ``getattr(..., default)`` work as before).

    Example:
        >>> raise RemovedNameError("ddpkit.x was removed: use ddpkit.checkpoint.x")
        Traceback (most recent call last):
        ...
        ddpkit.errors.RemovedNameError: ddpkit.x was removed: use ddpkit.checkpoint.x
    """


class UnsafeFolderError(ConfigError):
    """A folder ddpkit would load code from (compiled kernels) can be written by someone
    else: another owner, or write permission for its group or for everyone. Never loaded.

    Example:
        >>> err = UnsafeFolderError("/tmp/kernels", "it is writable by its group (mode 0775)")
        >>> print(err)  # doctest: +ELLIPSIS
        /tmp/kernels is not private: it is writable by its group (mode 0775); ddpkit runs ...
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(
            f"{path} is not private: {reason}; ddpkit runs code from it (compiled kernels), "
            "so it uses only a folder that you own and that nobody else can write: remove "
            f"it, or `chmod go-w {path}` if it is yours"
        )


class NotInitializedError(DdpkitError, RuntimeError):
    """A ddpkit call needs the world, but ``ddpkit.init()`` has not run in this process.

    Example:
        >>> raise NotInitializedError("call ddpkit.init() first")
        Traceback (most recent call last):
        ...
        ddpkit.errors.NotInitializedError: call ddpkit.init() first
    """


class RendezvousError(DdpkitError, RuntimeError):
    """The processes of a job could not find each other (store, address, port, timeout).

    Example:
        >>> raise RendezvousError("ranks did not join 127.0.0.1:29500 within 30 s")
        Traceback (most recent call last):
        ...
        ddpkit.errors.RendezvousError: ranks did not join 127.0.0.1:29500 within 30 s
    """

    def __init__(self, message: str, retriable: bool = True) -> None:
        super().__init__(message)
        # a peer not there yet, a name not resolvable yet: worth trying the job again;
        # a port another process holds is not
        self.retriable = retriable


class WorkerFailedError(DdpkitError, RuntimeError):
    """A worker process of a launched job failed; carries its rank, exit code and traceback.

    Example:
        >>> err = WorkerFailedError(rank=1, exitcode=1, detail="ValueError: bad batch")
        >>> err.rank, err.exitcode
        (1, 1)
    """

    def __init__(
        self,
        rank: int,
        exitcode: int,
        detail: str,
        headline: str | None = None,
        peer_lost: bool = False,
    ) -> None:
        self.rank = rank
        self.exitcode = exitcode
        self.detail = detail
        self.peer_lost = peer_lost  # it failed only because a peer on another node went away
        how = f"killed by signal {-exitcode}" if exitcode < 0 else f"exit code {exitcode}"
        super().__init__(f"{headline or f'worker rank {rank} failed ({how})'}:\n{detail}")


class ScriptError(DdpkitError):
    """The training script cannot run at all (it does not compile), found before any worker
    was started. Carries Python's own message: file, line and caret.

    Example:
        >>> ScriptError("train.py cannot run").exitcode
        1
    """

    exitcode = 1  # as `python train.py` exits on a SyntaxError


class CheckpointError(DdpkitError, RuntimeError):
    """A checkpoint could not be written, read, or does not match the model it is loaded into.

    Example:
        >>> raise CheckpointError("runs/x/epoch_000002.pt is truncated")
        Traceback (most recent call last):
        ...
        ddpkit.errors.CheckpointError: runs/x/epoch_000002.pt is truncated
    """


class CollectiveMismatchError(DdpkitError, RuntimeError):
    """Ranks called different collectives, or the same one with different shapes or dtypes.

    Example:
        >>> raise CollectiveMismatchError("rank 0 calls ALLREDUCE [3] Float, rank 1 [4] Float")
        Traceback (most recent call last):
        ...
        ddpkit.errors.CollectiveMismatchError: rank 0 calls ALLREDUCE [3] Float, rank 1 [4] Float
    """


class ReplicaDivergenceError(DdpkitError, RuntimeError):
    """DDP replicas that must be identical on every rank are not; names ranks and tensors.

    Example:
        >>> err = ReplicaDivergenceError(step=4, ranks=[1], tensors=["0.weight"], detail="")
        >>> err.ranks, err.tensors
        ([1], ['0.weight'])
    """

    def __init__(self, step: int, ranks: list[int], tensors: list[str], detail: str) -> None:
        self.step = step
        self.ranks = ranks
        self.tensors = tensors
        who = (f"rank {ranks[0]} differs" if len(ranks) == 1 else
               f"ranks {','.join(map(str, ranks))} differ")  # fmt: skip
        more = f" and {len(tensors) - 8} more" if len(tensors) > 8 else ""
        shown = ", ".join(tensors[:8]) + more
        super().__init__(f"replicas diverged at step {step}: {who} from rank 0 in {shown}{detail}")


class NonFiniteLossError(DdpkitError, FloatingPointError):
    """A rank's loss was NaN or infinite; names the step and the ranks.

    Raised before that step's optimizer update, so the weights were not changed by it.

    Example:
        >>> err = NonFiniteLossError(step=12, epoch=2, ranks={1: "nan"})
        >>> err.step, err.ranks
        (12, {1: 'nan'})
    """

    def __init__(self, step: int, epoch: int, ranks: dict[int, str]) -> None:
        self.step = step
        self.epoch = epoch
        self.ranks = ranks
        where = ", ".join(f"{value} on rank {rank}" for rank, value in sorted(ranks.items()))
        super().__init__(
            f"loss is {where} at step {step} (epoch {epoch}); stopped before that step's "
            "optimizer update. Lower the learning rate, check the data for NaN/inf, or pass "
            "nonfinite_loss='skip' to the Trainer to skip such steps"
        )


class MainRankStalledError(DdpkitError, RuntimeError):
    """Rank 0 stopped beating, or failed, inside ``ddpkit.main_first()``: named with its line.

    Example:
        >>> str(MainRankStalledError("rank 0 stopped inside main_first() at train.py:12"))
        'rank 0 stopped inside main_first() at train.py:12'
    """


class PreemptedError(DdpkitError):
    """The workers were asked to stop (SIGTERM / SIGUSR1), saved a checkpoint and exited.

    ``exitcode`` is :data:`ddpkit._core.protocol.PREEMPTED_EXIT_CODE` (75); running the same
    command again resumes from the checkpoint.

    Example:
        >>> PreemptedError("stopped by SIGTERM at epoch 5, step 412").exitcode
        75
    """

    exitcode = PREEMPTED_EXIT_CODE  # EX_TEMPFAIL (sysexits.h): a temporary failure, try again


class StoppedBySignalError(DdpkitError):
    """The launcher itself got a signal (Ctrl-C, SIGTERM) and stopped its workers.

    Example:
        >>> StoppedBySignalError("SIGINT", 2).exitcode
        130
    """

    def __init__(self, signal_name: str, signum: int) -> None:
        self.signal_name = signal_name
        self.exitcode = 128 + signum  # how a shell reports a process ended by that signal
        super().__init__(f"got {signal_name}; all workers were stopped")
