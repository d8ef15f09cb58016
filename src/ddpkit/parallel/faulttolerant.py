"""**Experimental.** :class:`FaultTolerantStrategy`: replica groups that train on when one
fails, through torchft (``pip install 'ddpkit[ft]'``).

Each replica group is an ordinary ddpkit job (``ddpkit run``, any size), wrapped in DDP
inside the group. Across groups, after each backward, the gradients are averaged over the
groups alive at this step by torchft's ``Manager``: a quorum at the lighthouse, an
all-reduce among its members, and a vote before the optimizer steps (a step whose exchange
failed is dropped on every group, not half taken). A group that dies is left out of the
next quorum (the lighthouse's heartbeat timeout) and the others go on at the smaller size,
without a restart; a group started again joins the next quorum and heals first: it receives
the run's whole state (models, optimizers, the step) from a live peer, then trains on.

"Experimental" means: the options and lines may change, CPU/gloo is what the tests run,
and the data is not yet dealt again when a group drops (each group reads the loader it was
given, so a dead group's batches are not trained on while it is down). ddpkit's checkpoints
go on underneath, so losing every group resumes from the last one.

Example:
    >>> FaultTolerantStrategy(group="0", lighthouse="http://10.0.0.1:29510")
    FaultTolerantStrategy(group='0', lighthouse='http://10.0.0.1:29510')
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from ddpkit._core.log import logger
from ddpkit._core.protocol import FT_GROUP_ENV
from ddpkit.errors import ConfigError
from ddpkit.parallel.base import checked_options
from ddpkit.parallel.ddp import DDPStrategy

if TYPE_CHECKING:
    from ddpkit.env.world import World

LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"  # torchft's own name for the lighthouse's address
INSTALL = "pip install 'ddpkit[ft]' (torchft)"


class Restorable(Protocol):
    """What a group hands a healing peer: the run's whole state (ddpkit's RunState)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Dealer(Protocol):
    """What deals the batches among the groups (:class:`ReplicaBatches`)."""

    @property
    def idle(self) -> bool: ...

    def committed(self, participants: int) -> None: ...

    def state_dict(self) -> dict[str, int]: ...

    def load_state_dict(self, state: dict[str, int]) -> None: ...


@checked_options
@dataclass(frozen=True, repr=False, kw_only=True)
class FaultTolerantStrategy(DDPStrategy):
    """**Experimental.** DDP inside each replica group; across groups, gradients averaged
    over the groups alive at each step by torchft, a failed group left out without a restart
    and healed from a live peer when it comes back.

    ``group``: this replica group's name (default ``DDPKIT_FT_GROUP``); ``lighthouse``:
    the torchft lighthouse's address (default ``TORCHFT_LIGHTHOUSE``); ``min_groups``: the
    fewest groups a step may be taken with; ``timeout_s``: how long one exchange may take;
    ``quorum_retries``: quorum attempts before a group gives up (a lighthouse outage).
    DDP's options are its own too.

    Example:
        >>> FaultTolerantStrategy(group="1", min_groups=1).uneven_batches
        'join'
    """

    group: str | None = None
    lighthouse: str | None = None
    min_groups: int = 1
    timeout_s: float = 30.0
    quorum_retries: int = 3

    @property
    def layout(self) -> str:
        return f"replica group {self._group()} of a fault-tolerant job (experimental, torchft)"

    def wrap(self, model: nn.Module, world: World) -> nn.Module:
        wrapped = super().wrap(model, world)
        wrapped.ddpkit_strategy = self  # type: ignore[assignment]  # a plain module too
        wrapped.ddpkit_replicas = ReplicaGroups(self, world)  # type: ignore[assignment]
        return wrapped

    def _torch_options(self) -> dict[str, Any]:
        ddp = set(DDPStrategy.fields())  # this strategy's own fields are not DDP's
        return {k: v for k, v in super()._torch_options().items() if k in ddp}

    def attach(self, model: nn.Module, run: Restorable) -> None:
        replica_groups(model).attach(run)

    def start_update(self, model: nn.Module) -> None:
        replica_groups(model).start()

    def finish_update(self, model: nn.Module) -> bool:
        return replica_groups(model).average_and_vote(model)

    def _group(self) -> str:
        group = self.group if self.group is not None else os.environ.get(FT_GROUP_ENV)
        if not group:
            raise ConfigError(f"FaultTolerantStrategy needs its replica group: group='0', or "
                              f"{FT_GROUP_ENV}=0 in each group's environment")  # fmt: skip
        return group


def replica_groups(model: nn.Module) -> ReplicaGroups:
    """The replica groups of a model :class:`FaultTolerantStrategy` wrapped.

    Example::

        replica_groups(model).position()   # this group's place in this step's quorum
    """
    from ddpkit.parallel.compiled import uncompiled

    replicas = getattr(uncompiled(model), "ddpkit_replicas", None)
    assert isinstance(replicas, ReplicaGroups), "a model FaultTolerantStrategy wrapped"
    return replicas


class ReplicaGroups:
    """This group's torchft Manager: the quorum, the exchange and the vote of every step.

    Example::

        groups = ReplicaGroups(strategy, world); groups.attach(run); groups.start()
        if groups.average_and_vote(model): optimizer.step()
    """

    def __init__(self, strategy: FaultTolerantStrategy, world: World) -> None:
        torchft = _torchft()
        lighthouse = strategy.lighthouse or os.environ.get(LIGHTHOUSE_ENV)
        if not lighthouse:
            raise ConfigError(f"FaultTolerantStrategy needs the lighthouse's address: "
                              f"lighthouse='http://HOST:PORT', or {LIGHTHOUSE_ENV}")  # fmt: skip
        self.group, self.lighthouse = strategy._group(), lighthouse
        timeout = timedelta(seconds=strategy.timeout_s)
        pg = torchft.ProcessGroupGloo(timeout=timeout) if world.device.type == "cpu" else (
            torchft.ProcessGroupNCCL(timeout=timeout))  # fmt: skip
        try:
            self.manager = torchft.Manager(
                pg=pg, load_state_dict=None, state_dict=None, min_replica_size=strategy.min_groups,
                replica_id=f"ddpkit_group_{self.group}", lighthouse_addr=lighthouse,
                rank=world.rank, world_size=world.world_size, timeout=timeout,
                quorum_timeout=timeout, connect_timeout=timeout,
                quorum_retries=strategy.quorum_retries,
            )  # fmt: skip
        except RuntimeError as err:
            said = f"within {strategy.timeout_s:g} s: {err}"
            raise ConfigError(f"replica group {self.group} could not reach the lighthouse at "
                              f"{lighthouse} {said}") from None  # fmt: skip
        self._open = False  # a quorum asked for and not voted on yet
        self._asked = time.perf_counter()  # when this step's quorum was asked for
        self._received: tuple[int, float] | None = None  # a heal's bytes and seconds
        self._last_step, self._size = 0, 0
        self._dealer: Dealer | None = None
        logger.info(f"replica group {self.group}: fault-tolerant across groups (experimental), "
                    f"lighthouse {lighthouse}")  # fmt: skip

    def attach(self, run: Restorable) -> None:
        """A peer that heals from this group receives ``run`` whole (before any quorum)."""

        def receive(state: dict[str, Any]) -> None:  # healing: what came, and how long it took
            self._received = (_tensor_bytes(state), time.perf_counter() - self._asked)
            run.load_state_dict(state)

        self.manager.register_state_dict_fn("ddpkit", receive, run.state_dict)

    def deal_with(self, dealer: Dealer) -> None:
        """Batches dealt by ``dealer`` (its state healed too; idle: zero gradients)."""
        self.manager.register_state_dict_fn("ddpkit_batches", dealer.load_state_dict,
                                            dealer.state_dict)  # fmt: skip
        self._dealer = dealer

    def start(self) -> None:
        """Before a step's batch or backward: ask for this step's quorum (once a step)."""
        if not self._open:
            self._asked = time.perf_counter()
            self.manager.start_quorum()
            self._open = True

    def position(self) -> int | None:
        """This group's place in this step's quorum (None: healing, it only receives)."""
        rank = self.manager.participating_rank()
        return None if rank is None else int(rank)

    def average_and_vote(self, model: nn.Module) -> bool:
        """After backward: the gradients averaged over the groups in the quorum; whether
        every group may take the step (False: drop it everywhere)."""
        gradients = _with_gradients(model)
        if self._dealer is not None and self._dealer.idle:
            for grad in gradients:  # no batch of its own this step: it adds nothing
                grad.zero_()
        works = [self.manager.allreduce(grad) for grad in gradients]
        for work in works:
            work.wait()  # torchft divides by the participants here
        commit = bool(self.manager.should_commit())
        self._open = False
        participants = self.manager.num_participants()
        if commit and self._dealer is not None:
            self._dealer.committed(participants)
        self._say_changes(participants)
        return commit

    def _say_changes(self, size: int) -> None:
        """One line when the quorum's size changes or this group healed (caught up)."""
        step = self.manager.current_step()
        if step > self._last_step + 1:
            got, seconds = self._received or (0, 0.0)
            logger.info(f"replica group {self.group}: healed from a live peer, at step {step} "
                        f"(was at step {self._last_step}): the run's state, {got / 2**20:.2f} "
                        f"MiB, received in {seconds:.2f} s")  # fmt: skip
            self._received = None
        if size != self._size:
            logger.info(f"replica group {self.group}: step {step} with {size} replica "
                        f"group(s) (was {self._size})")  # fmt: skip
        self._last_step, self._size = step, size


def _tensor_bytes(state: Any) -> int:
    """The bytes of the tensors in a (nested) state dict."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_tensor_bytes(value) for value in state.values())
    if isinstance(state, list | tuple):
        return sum(_tensor_bytes(value) for value in state)
    return 0


def _with_gradients(model: nn.Module) -> list[torch.Tensor]:
    """Every parameter's gradient, a zero one where backward left none: each group must
    all-reduce the same tensors in the same order."""
    for param in model.parameters():
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)
    return [param.grad for param in model.parameters() if param.grad is not None]


def _torchft() -> Any:
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's own log: lines on every quorum else
    try:
        import torchft
    except ImportError:
        raise ConfigError(f"FaultTolerantStrategy needs torchft: {INSTALL}") from None
    return torchft
