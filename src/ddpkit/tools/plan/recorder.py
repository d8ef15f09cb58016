"""What ``ddpkit plan`` records inside the script it runs: one rank of a world the machine does
not have, over torch's fake process group.

``ddpkit plan`` starts the unchanged script as one process with the launcher's variables of
rank 0 of the planned world (``WORLD_SIZE=1024`` ...) and :func:`install` named in
``DDPKIT_WORKER_SETUP``. Before the script runs, :func:`install` makes the default process
group torch's fake one at that size (``ddpkit.init`` then finds it joined), starts logging
every collective the process issues (a dispatch mode sees each c10d op, whoever calls it:
FSDP, DTensor, ddpkit's own), and registers a :class:`PlanRecorder` callback. The fake
group moves nothing and its works carry no result, which DDP's reducer cannot use: for DDP
the recorder's communication hook logs each gradient bucket and hands it back as it is (the
sum over one rank). After each step the recorder measures what the rank holds and writes
the plan to ``DDPKIT_PLAN_OUT``; ``DDPKIT_MAX_STEPS`` ends the run after the steps asked for.

Example::

    DDPKIT_WORKER_SETUP=ddpkit.tools.plan.recorder:install DDPKIT_PLAN_OUT=/tmp/p \\
        RANK=0 WORLD_SIZE=1024 LOCAL_WORLD_SIZE=8 python -m ddpkit.launch.worker train.py
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddpkit._compat.fakepg import DispatchMode, group_size_of, join_fake_world
from ddpkit._core.atomicfile import atomic_write
from ddpkit._core.protocol import PLAN_OUT_ENV
from ddpkit.compiling.wrap import uncompiled
from ddpkit.errors import ConfigError
from ddpkit.parallel.shards import local
from ddpkit.parallel.strategy import strategy_of
from ddpkit.runtime.callbacks import Callback, RunView, register_callback
from ddpkit.tools.plan.costs import Collective, Kind, Memory, Plan

PLAN_FILE = "plan.json"

# c10d's ops (and the functional ones) by what they do; the rest are "other" or not traffic
_KINDS = {
    "allreduce_": Kind.ALL_REDUCE, "allreduce_coalesced_": Kind.ALL_REDUCE,
    "all_reduce": Kind.ALL_REDUCE, "all_reduce_coalesced": Kind.ALL_REDUCE,
    "allgather_": Kind.ALL_GATHER, "_allgather_base_": Kind.ALL_GATHER,
    "allgather_coalesced_": Kind.ALL_GATHER, "allgather_into_tensor_coalesced_": Kind.ALL_GATHER,
    "all_gather_into_tensor": Kind.ALL_GATHER, "all_gather_into_tensor_coalesced": Kind.ALL_GATHER,
    "reduce_scatter_": Kind.REDUCE_SCATTER, "_reduce_scatter_base_": Kind.REDUCE_SCATTER,
    "reduce_scatter_tensor_coalesced_": Kind.REDUCE_SCATTER,
    "reduce_scatter_tensor": Kind.REDUCE_SCATTER,
    "reduce_scatter_tensor_coalesced": Kind.REDUCE_SCATTER,
    "broadcast_": Kind.BROADCAST, "broadcast": Kind.BROADCAST,
}  # fmt: skip
_NOT_TRAFFIC = {"barrier", "monitored_barrier_", "wait_tensor", "wait"}
_NAMESPACES = ("c10d", "_c10d_functional")


def install() -> PlanRecorder:
    """The worker setup ``ddpkit plan`` names in ``DDPKIT_WORKER_SETUP``: join the fake world
    of ``WORLD_SIZE`` as ``RANK``, log the collectives, record the plan.

    Example::

        DDPKIT_WORKER_SETUP=ddpkit.tools.plan.recorder:install   # set by ddpkit plan
    """
    join_fake_world(int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"]))
    recorder = PlanRecorder(Path(os.environ[PLAN_OUT_ENV]))
    recorder.log.__enter__()  # type: ignore[no-untyped-call]  # the set-up's count too
    return register_callback(recorder)


class CollectiveLog(DispatchMode):  # type: ignore[no-untyped-call]
    """Every collective this process issues while entered, as :class:`Collective` records,
    each with the step it was issued in (``step``, which its owner moves).

    Example:
        >>> CollectiveLog().calls
        []
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.calls: list[Collective] = []
        self.step = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:  # fmt: skip
        kwargs = kwargs or {}
        if func.namespace in _NAMESPACES:
            self._note(func, list(args) + list(kwargs.values()))
        return func(*args, **kwargs)

    def _note(self, func: Any, args: list[Any]) -> None:
        name = func._schema.name.split("::")[-1]
        if name in _NOT_TRAFFIC:
            return
        kind = _KINDS.get(name, Kind.OTHER)
        size = _size_of(kind, func.namespace, args)
        self.add(
            Collective(
                kind, size, _group_size(func.namespace, args), self.step, f"{func.namespace}.{name}"
            )
        )

    def add(self, call: Collective) -> None:
        """One more collective (DDP's buckets come through here too)."""
        self.calls.append(call)


def _size_of(kind: Kind, namespace: str, args: list[Any]) -> int:
    """S of the collective (see :class:`Collective`), from its tensor arguments."""
    if namespace == "_c10d_functional":  # (input, [op,] group_size, group_name): a new output
        size = _nbytes(args[:1])
        return size * _group_size(namespace, args) if kind is Kind.ALL_GATHER else size
    if kind is Kind.REDUCE_SCATTER:  # (output(s), input(s), ...): the input is S
        return _nbytes(args[1:2])
    return _nbytes(args[:1])  # all-gather: its output(s); all-reduce, broadcast: the tensors


def _nbytes(values: Iterable[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(values))


def _tensors(values: Iterable[Any]) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)


def _group_size(namespace: str, args: list[Any]) -> int:
    """The group's size: c10d's process group argument's, a functional op's ``group_size``."""
    for value in args:
        size = group_size_of(value)
        if size is not None:
            return size
    sizes = [v for v in args if isinstance(v, int) and not isinstance(v, bool)]
    return sizes[0] if namespace == "_c10d_functional" and sizes else dist.get_world_size()


class PlanRecorder(Callback):
    """Follows the dry run's steps; after each, rank 0's memory and the plan so far, written.

    Example:
        >>> PlanRecorder(Path("/tmp/plan")).log.calls
        []
    """

    def __init__(self, out: Path) -> None:
        self.out = out
        self.log = CollectiveLog()
        self.memory = Memory()
        self.plan: Plan | None = None

    def on_fit_start(self, trainer: RunView) -> None:
        """Before the first step: DDP's buckets logged, gradients measured before each step."""
        model = trainer.model
        world = trainer.world
        name = strategy_of(model).name
        self.plan = Plan(world.world_size, world.local_world_size, name, steps=0,
                         parameters=sum(p.numel() for p in model.parameters()))  # fmt: skip
        if name == "ddp":
            self._log_buckets(unwrap_ddp(model))
        for optimizer in trainer.optimizers.values():
            optimizer.register_step_pre_hook(lambda *_: self._measure_gradients(model))

    def on_train_batch_start(self, trainer: RunView, batch: Any) -> None:
        """What comes now belongs to the next step."""
        self.log.step = trainer.step + 1

    def on_train_batch_end(self, trainer: RunView, batch: Any, metrics: Any) -> None:
        """After a step: what the rank holds, and the plan so far written."""
        self._measure_state(trainer)
        if self.plan is not None:
            self.plan.steps = trainer.step
            self.write()
        self.log.step = trainer.step  # between steps (an epoch's end, validation)

    def write(self) -> None:
        """The plan so far, in ``out``/plan.json (whole: written aside, then renamed)."""
        assert self.plan is not None
        self.plan.memory = self.memory
        self.plan.collectives = list(self.log.calls)
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            self.memory.device_peak = torch.cuda.max_memory_allocated()
        text = json.dumps(self.plan.to_json())
        atomic_write(self.out / PLAN_FILE, lambda handle: handle.write(text.encode()),
                     durable=False)  # fmt: skip

    def _log_buckets(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        group_size = ddp.process_group.size()

        def bucket_logged(
            _state: object, bucket: dist.GradBucket
        ) -> torch.futures.Future[torch.Tensor]:
            buffer = bucket.buffer()
            self.log.add(
                Collective(
                    Kind.ALL_REDUCE,
                    buffer.numel() * buffer.element_size(),
                    group_size,
                    self.log.step,
                    f"DDP bucket {bucket.index()}",
                )
            )
            if not ddp.gradient_as_bucket_view:  # buckets beside the gradients: memory too
                self.memory.buffers = max(self.memory.buffers, _bucket_total(self.log.calls))
            done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            done.set_result(buffer)  # the fake group moves nothing: the sum over one rank
            return done

        # DDP checks the annotations themselves, which this module's are strings
        bucket_logged.__annotations__.update(
            {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
        )
        try:
            ddp.register_comm_hook(None, bucket_logged)
        except RuntimeError:
            raise ConfigError(
                "ddpkit plan counts DDP's plain all-reduce and the model already has a "
                "communication hook (comm_hook=...): plan without it (bf16 or fp16 halve the "
                "bytes counted; PowerSGD sends far fewer)"
            ) from None

    def _measure_gradients(self, model: nn.Module) -> None:
        grads = _unique(local(p.grad) for p in model.parameters() if p.grad is not None)
        self.memory.gradients = max(self.memory.gradients, _nbytes(grads))

    def _measure_state(self, trainer: RunView) -> None:
        memory = self.memory
        memory.parameters = _nbytes(_unique(local(p) for p in trainer.model.parameters()))
        state = [s for opt in trainer.optimizers.values() for s in opt.state.values()]
        memory.optimizer = _nbytes(_unique(local(t) for t in _tensors_in(state)))
        gathered = [c.bytes for c in self.log.calls if c.kind is Kind.ALL_GATHER and c.step > 0]
        if strategy_of(trainer.model).name in ("fsdp", "hsdp") and gathered:
            memory.buffers = max(gathered)  # the largest unit, gathered whole for its turn


def unwrap_ddp(model: nn.Module) -> nn.parallel.DistributedDataParallel:
    """The DDP module itself (under torch.compile's wrapper, where compiled).

    Example::

        unwrap_ddp(prepare_model(net)).process_group.size()
    """
    inner = uncompiled(model)
    if not isinstance(inner, nn.parallel.DistributedDataParallel):
        raise ConfigError(f"ddpkit plan: the DDP model is a {type(inner).__name__}, not a "
                          "DistributedDataParallel")  # fmt: skip
    return inner


def _bucket_total(calls: list[Collective]) -> int:
    """DDP's buckets of one step: each bucket once."""
    buckets = {c.source: c.bytes for c in calls if c.source.startswith("DDP bucket")}
    return sum(buckets.values())


def _unique(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Each storage once (tied weights, views of one bucket)."""
    seen: dict[tuple[int, int], torch.Tensor] = {}
    for t in tensors:
        seen.setdefault((t.untyped_storage().data_ptr(), int(t.storage_offset())), t)
    return list(seen.values())


def _tensors_in(values: Iterable[Any]) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, dict):
            yield from _tensors_in(value.values())
        elif isinstance(value, (list, tuple)):
            yield from _tensors_in(value)
