"""**Experimental.** :class:`FaultTolerantStrategy`: replica groups that train on when one
fails, through torchft (``pip install 'ddpkit[ft]'``).

Each replica group is an ordinary ddpkit job (``ddpkit run``, any size), wrapped in DDP
inside the group. Across groups, after each backward, the gradients are averaged over the
groups alive at this step by torchft's ``Manager``: a quorum at the lighthouse, an
all-reduce among its members (a few flat buckets, :mod:`~ddpkit.parallel.ftbuckets`, not
one per parameter), and a vote before the optimizer steps (a step whose exchange
failed is dropped on every group, not half taken). A group that dies is left out of the
next quorum (the lighthouse's heartbeat timeout) and the others go on at the smaller size,
without a restart; a group started again joins the next quorum and heals first: it receives
the run's whole state (models, optimizers, the step) from a live peer, then trains on.

"Experimental" means: the options and lines may change, and CPU/gloo is what the tests
run. The batches are dealt among the groups alive at each step by
:class:`~ddpkit.parallel.replicabatches.ReplicaBatches`, so each sample is trained on once
per epoch whichever groups come and go. ddpkit's checkpoints go on underneath, so losing
every group resumes from the last one.

Example:
    >>> FaultTolerantStrategy(group="0", lighthouse="http://10.0.0.1:29510")
    FaultTolerantStrategy(group='0', lighthouse='http://10.0.0.1:29510')
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from ddpkit._core.log import logger
from ddpkit._core.protocol import FT_GROUP_ENV
from ddpkit.errors import ConfigError, RendezvousError
from ddpkit.parallel.base import checked_options
from ddpkit.parallel.ddp import DDPStrategy
from ddpkit.parallel.ftbuckets import DEFAULT_CAP_MB, Buckets
from ddpkit.parallel.ftmembers import Members
from ddpkit.parallel.ftquorum import install as install_quorum_numbers
from ddpkit.parallel.options import bounded

if TYPE_CHECKING:
    from ddpkit.env.world import World

LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"  # torchft's own name for the lighthouse's address
INSTALL = "pip install 'ddpkit[ft]' (torchft)"


class Restorable(Protocol):
    """What a group hands a healing peer: the run's whole state (ddpkit's RunState)."""

    step: int  # optimizer steps taken (after a resume: the checkpoint's)

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Dealer(Protocol):
    """What deals the batches among the groups
    (:class:`~ddpkit.parallel.replicabatches.ReplicaBatches`)."""

    def loss_weight(self, participants: int) -> float: ...

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
    DDP's options are its own too (``bucket_cap_mb`` also sizes the buckets the gradients
    cross between groups in, :mod:`~ddpkit.parallel.ftbuckets`). The groups start from
    identical weights (seeded alike, as ``ddpkit.init(seed=...)`` does), which the first
    step checks; a group that joins a running job receives the others' state instead.

    Example:
        >>> FaultTolerantStrategy(group="1", min_groups=1).uneven_batches
        'join'
    """

    across_groups = True  # the loop refuses what one group cannot do alone
    group: str | None = None
    lighthouse: str | None = None
    min_groups: int = bounded(1, least=1, means="groups")
    timeout_s: float = bounded(30.0, above=0, means="seconds")
    quorum_retries: int = bounded(3, least=0)

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

    def loss_weight(self, model: nn.Module) -> float:
        return replica_groups(model).loss_weight()

    def finish_update(self, model: nn.Module) -> bool:
        return replica_groups(model).average_and_vote(model)

    def _group(self) -> str:
        group = self.group if self.group is not None else os.environ.get(FT_GROUP_ENV)
        if not group:
            raise ConfigError(f"FaultTolerantStrategy needs its replica group: group='0', or "
                              f"{FT_GROUP_ENV}=0 in each group's environment")  # fmt: skip
        if not group.isdigit():  # torchft places a group's ranks by its number
            raise ConfigError(f"a replica group is a number (0, 1, ...), not {group!r}: "
                              f"group='1', or {FT_GROUP_ENV}=1")  # fmt: skip
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
        torchft = import_torchft()
        lighthouse = strategy.lighthouse or os.environ.get(LIGHTHOUSE_ENV)
        if not lighthouse:
            raise ConfigError(f"FaultTolerantStrategy needs the lighthouse's address: "
                              f"lighthouse='http://HOST:PORT', or {LIGHTHOUSE_ENV} (ddpkit "
                              "lighthouse starts one; ddpkit verify starts its own with "
                              "--replica-groups G)")  # fmt: skip
        self.group, self.lighthouse = strategy._group(), lighthouse
        self.rank, self.size = world.rank, world.world_size  # within the group
        self.timeout_s, self.retries = strategy.timeout_s, strategy.quorum_retries
        timeout = timedelta(seconds=strategy.timeout_s)
        pg = torchft.ProcessGroupGloo(timeout=timeout) if world.device.type == "cpu" else (
            torchft.ProcessGroupNCCL(timeout=timeout))  # fmt: skip
        from ddpkit.parallel.ftheal import HealTransport

        self.transport = HealTransport(timeout)
        self._store, store_addr, store_port = _group_store(world)
        try:
            self.manager = torchft.Manager(
                pg=pg, load_state_dict=None, state_dict=None, min_replica_size=strategy.min_groups,
                checkpoint_transport=self.transport, store_addr=store_addr, store_port=store_port,
                replica_id=f"ddpkit_group_{self.group}", lighthouse_addr=lighthouse,
                rank=world.rank, world_size=world.world_size, timeout=timeout,
                quorum_timeout=timeout, connect_timeout=timeout,
                quorum_retries=strategy.quorum_retries, init_sync=False,
            )  # fmt: skip
        except RuntimeError as err:
            said = f"within {strategy.timeout_s:g} s: {err}"
            raise ConfigError(f"replica group {self.group} could not reach the lighthouse at "
                              f"{lighthouse} {said}") from err  # fmt: skip
        # torchft's servers (the manager's, the heal transport's) stop when the process ends,
        # however the run ends, or once this object is gone: the lighthouse then sees the
        # group leave at once, and no thread of torchft's holds the process open.
        self.close = weakref.finalize(self, _shut_down, self.manager)
        # quorum numbers that a restarted lighthouse does not give out again
        install_quorum_numbers(self.manager)
        self._open = False  # a quorum asked for and not voted on yet
        self.votes = 0  # steps voted on so far (a dealer checks one batch a step)
        self.members = Members(int(self.group), world.device)
        cap_mb = strategy.bucket_cap_mb if strategy.bucket_cap_mb is not None else DEFAULT_CAP_MB
        self.buckets = Buckets(cap_bytes=int(cap_mb * 2**20))
        self._started = False  # whether the groups' start was checked
        self._last_step = 0
        self._dealer: Dealer | None = None
        self._run: Restorable | None = None
        logger.info(f"replica group {self.group}: fault-tolerant across groups (experimental), "
                    f"lighthouse {lighthouse}")  # fmt: skip

    def attach(self, run: Restorable) -> None:
        """A peer that heals from this group receives ``run`` whole (before any quorum)."""
        self.manager.register_state_dict_fn("ddpkit", run.load_state_dict, run.state_dict)
        self._run = run

    def deal_with(self, dealer: Dealer) -> None:
        """Batches dealt by ``dealer`` (its state healed too; idle: zero gradients)."""
        self.manager.register_state_dict_fn("ddpkit_batches", dealer.load_state_dict,
                                            dealer.state_dict)  # fmt: skip
        self._dealer = dealer

    def start(self) -> None:
        """Before a step's batch or backward: ask for this step's quorum (once a step)."""
        if not self._open:
            if not self.votes:
                self._resume_step()
            self.manager.start_quorum()
            self._open = True

    def _resume_step(self) -> None:
        """Before the first quorum of a run resumed from its checkpoint: torchft's step is
        the checkpoint's, so that a group resumed from an older one (or started anew) heals
        from the most advanced instead of all starting again at step 0."""
        if self._run is not None and self._run.step and not self.manager.current_step():
            self.manager.load_state_dict({"step": self._run.step, "batches_committed": 0})

    def position(self) -> int | None:
        """This group's place in this step's quorum (None: healing, it only receives)."""
        try:
            rank = self.manager.participating_rank()
        except TimeoutError as err:  # torchft gave up on the quorum, retries included
            raise RendezvousError(
                f"replica group {self.group}: no quorum at the lighthouse {self.lighthouse} "
                f"within {self.timeout_s:g} s, {self.retries} retries included ({err}); is the "
                "lighthouse running? A longer outage needs a larger "
                "FaultTolerantStrategy(timeout_s=...)"
            ) from err
        return None if rank is None else int(rank)

    def loss_weight(self) -> float:
        """Before backward: what this rank's loss counts for (its dealer's weighing; 1 for
        batches the groups do not share out)."""
        if self._dealer is None:
            return 1.0
        return self._dealer.loss_weight(self.manager.num_participants())

    def average_and_vote(self, model: nn.Module) -> bool:
        """After backward: the gradients averaged over the groups in the quorum; whether
        every group may take the step (False: drop it everywhere)."""
        if not self._started:
            self._check_same_start(model)
        # every gradient and the members' slots in few all-reduces, averaged in place
        # (torchft divides by the participants)
        tensors = [*_with_gradients(model), self.members.slots()]
        self.buckets.finish(self.buckets.start(self.manager, tensors))
        commit = bool(self.manager.should_commit())
        self._open, self.votes = False, self.votes + 1
        participants = self.manager.num_participants()
        if commit and self._dealer is not None:
            self._dealer.committed(participants)
        step = self.manager.current_step()
        self._say_heal(step)
        self.members.say(step, participants, commit)
        return commit

    def _check_same_start(self, model: nn.Module) -> None:
        """At the job's first step (every group at step 0, none healing), whether all groups
        start from the same weights: each parameter's sum, and its square, averaged over the
        groups; the two agree only where every group's sums are equal."""
        self._started = True
        if self.manager.current_step() != 0 or self.position() is None:
            return  # joining a running job: it heals from a peer
        sums = torch.stack([p.detach().double().sum() for p in model.parameters()])
        pair = torch.cat([sums, sums * sums])
        self.manager.allreduce(pair).wait()
        mean, mean_square = pair.chunk(2)
        if not torch.allclose(mean_square, mean * mean, rtol=1e-9, atol=1e-12):
            raise ConfigError(
                f"replica group {self.group}: the replica groups start from different weights; "
                "seed every group alike (ddpkit.init(seed=0) before building the model), or "
                "load the same weights in each"
            )

    def _say_heal(self, step: int) -> None:
        """One line when this group healed (caught up with the others)."""
        heal = self.transport.last_heal
        if step > self._last_step + 1 and heal is not None:
            logger.info(f"replica group {self.group}: healed at step {step} (was at step "
                        f"{self._last_step}): the run's state {heal.describe()}")  # fmt: skip
            self.transport.last_heal = None
        self._last_step = step


def _shut_down(manager: Any) -> None:
    try:
        manager.shutdown(wait=False)
    except Exception as err:  # at exit: said, never raised over the run's own ending
        logger.warning(f"torchft's manager did not shut down cleanly: {err}")


def _with_gradients(model: nn.Module) -> list[torch.Tensor]:
    """Every parameter's gradient, a zero one where backward left none: each group must
    all-reduce the same tensors in the same order."""
    for param in model.parameters():
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)
    return [param.grad for param in model.parameters() if param.grad is not None]


def _group_store(world: World) -> tuple[Any, str, int]:
    """Where the group's ranks meet torchft's manager: ``ddpkit run``'s store, or for a
    process started alone one of its own on loopback (kept alive with the group)."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        return None, addr, int(port)
    if world.world_size != 1:
        raise ConfigError("FaultTolerantStrategy needs the group's store in MASTER_ADDR and "
                          "MASTER_PORT: start each replica group with ddpkit run")  # fmt: skip
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    return store, "127.0.0.1", store.port


def import_torchft(who: str = "FaultTolerantStrategy") -> Any:
    """torchft, with its own log at warnings (else a line per quorum), or a ConfigError that
    says which extra to install.

    Example::

        torchft = import_torchft("ddpkit lighthouse")
    """
    os.environ.setdefault("RUST_LOG", "warn")
    try:
        import torchft
    except ImportError as err:  # missing, or installed and broken: said as it is
        raise ConfigError(f"{who} needs torchft, which did not import ({err}): {INSTALL}") from err
    return torchft
